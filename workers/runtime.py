"""Per-process worker state: the step store's connection pool, the registry, the publisher.

Built lazily in each prefork child (connections must not cross ``fork``), once per process
under a lock (a threads or gevent worker runs ``handle`` from many threads at once). The
step store's pool holds ``min(concurrency, ONWARD_DB_POOL_MAX)`` connections, each borrowed
for one statement; a message is published through a producer borrowed from Celery's
producer pool for that one publish, so no connection or channel is shared by two threads.

Eager continuation: after committing a step, the worker runs the run's next step itself
instead of publishing it, while the delivered message is within ``eager_steps`` /
``eager_window_ms``; then it publishes as usual. Within those limits the commit claims the
next step for this worker in the same statement (``StepStore.commit`` with a successor:
one transaction per eager step, not a claim and a commit), so nothing is published for it
and it starts from the checkpoint this worker just wrote. The next step is always of a
workflow version this worker has (the one it just ran, or migrated to). A crash between
such a commit and the end of the step it claimed leaves a lease that expires: the reaper
restores the run, as it does a run whose holder died mid-step (docs/design.md section 4).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import structlog
from celery import Celery

from ledger import tracing
from ledger.checkpoints import CheckpointKeys
from ledger.db import database_url
from ledger.steps import Claim, StaleReason, StepStore, error_record
from tasks import faults
from tasks.executor import ExecutorConfig, ReportKind, StepMessage, StepReport, execute_step
from tasks.llm import set_token_sink
from tasks.sensitive import seal_error
from tasks.workflow import Registry
from workers.broker import broker_url, message_priority
from workers.events import (
    FAILED_KINDS,
    EagerEvents,
    display_kwargs,
    display_name,
    trace_headers,
)
from workers.logs import bind_step
from workers.meter import StepMeter
from workers.settings import WorkerSettings
from workers.streams import RedisTokenSink

__all__ = ["STEP_TASK", "WorkerRuntime"]


STEP_TASK = "onward.step"

log = structlog.get_logger("onward.worker")


@dataclass
class WorkerRuntime:
    """Everything one worker process needs to execute steps."""

    app: Celery
    settings: WorkerSettings
    registry: Registry
    concurrency: int = 1  # steps this process runs at once (threads/gevent: -c N)
    main_pid: int = field(default_factory=os.getpid)  # the worker's main process (built there)
    _pid: int = field(default=0, init=False)
    _store: StepStore | None = field(default=None, init=False)
    _config: ExecutorConfig | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _events: EagerEvents | None = field(default=None, init=False)
    _stopping_main: bool = field(default=False, init=False)
    _broker_url: str = field(default="", init=False)
    meter: StepMeter | None = field(default=None, init=False)
    _worker_id: tuple[int, str] = field(default=(0, ""), init=False, repr=False)

    @property
    def pool_size(self) -> int:
        """Ledger connections of this process: one per step in flight, within the cap."""
        return max(1, min(self.concurrency, self.settings.db_pool_max))

    def _ensure_process_state(self) -> None:
        if self._pid == os.getpid() and self._store is not None:
            return
        with self._lock:
            if self._pid != os.getpid() or self._store is None:
                self._open_process_state()

    def _open_process_state(self) -> None:
        keys = CheckpointKeys.from_settings(self.settings)
        self._store = StepStore(database_url(self.settings), keys,
                                lease_ttl_s=self.settings.lease_ttl_s, pool_size=self.pool_size,
                                snapshot_every=self.settings.checkpoint_snapshot_every)
        self._config = ExecutorConfig(
            keys=keys,
            max_state_bytes=self.settings.max_state_bytes,
            retry_base_s=self.settings.retry_base_s,
            retry_max_s=self.settings.retry_max_s,
            max_artifact_bytes=self.settings.max_artifact_bytes,
            queue=self.settings.queue,
            handback_limit=self.settings.handback_limit,
            handback_max_delay_s=self.settings.worker_queue_ttl_s,
            max_json_depth=self.settings.max_json_depth,
            max_effect_payload_bytes=self.settings.max_effect_payload_bytes,
            max_approval_artifact_bytes=self.settings.max_approval_artifact_bytes,
            tool_timeout_s=self.settings.tool_timeout_s,
            tool_lease_margin_s=self.settings.tool_lease_margin_s,
            model_timeout_s=self.settings.model_timeout_s,
        )
        self._events = EagerEvents(self.app, self.settings.eager_events)
        self.meter = StepMeter(database_url(self.settings))
        tracing.enable("onward-worker")  # per process: exporters must not cross fork
        faults.arm_from_env()
        url = broker_url(self.settings)
        self._broker_url = url
        if url.startswith(("redis://", "rediss://", "unix://")):
            set_token_sink(RedisTokenSink(url))  # ctx.llm(..., stream=True) publishes here
        self._pid = os.getpid()  # last: other threads see a complete state or take the lock

    @property
    def store(self) -> StepStore:
        """This process's step store (opened on first use)."""
        self._ensure_process_state()
        assert self._store is not None
        return self._store

    def close(self) -> None:
        """Flush this process's step counters and close its ledger connections (the meter's
        thread would otherwise go on trying a database that may be gone)."""
        with self._lock:
            store, self._store = self._store, None
            meter, self.meter = self.meter, None
        if meter is not None:
            meter.close()
        if store is not None:
            store.close()

    def flush_events(self) -> None:
        """Let the eager steps' Flower events still queued be sent (the process exits)."""
        if self._events is not None:
            self._events.flush()

    @property
    def worker_id(self) -> str:
        """``host:pid`` of this process (the lease owner its claims record), computed once
        per process: ``gethostname`` is a system call, and this is asked every step."""
        if self._worker_id[0] != os.getpid():
            self._worker_id = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}")
        return self._worker_id[1]

    def publish(self, run_id: UUID, seq: int, queue: str, name: str | None = None,
                traceparent: str | None = None, priority: str | None = None) -> None:
        """Send the step message for ``(run_id, seq)`` (fast path, right after commit),
        shown in Flower as ``name`` (``<workflow>.<step>``), attempt 1, continuing the trace
        ``traceparent`` names, at the run's ``priority`` (docs/limits.md)."""
        with self.app.producer_pool.acquire(block=True) as producer:
            self.app.send_task(
                STEP_TASK,
                kwargs={"run_id": str(run_id), "seq": seq},
                queue=queue,
                producer=producer,
                shadow=name,
                headers=trace_headers(traceparent),
                argsrepr="()",
                kwargsrepr=display_kwargs(run_id, seq, 1),
                priority=message_priority(priority, self._broker_url),
            )

    def handle(self, kwargs: dict[str, Any], *, task_id: str | None = None,
               hostname: str = "", name: str | None = None,
               traceparent: str | None = None) -> StepReport:
        """Execute the delivered step, then (eagerly) the run's next ones; see the module doc.
        Each eager step is reported to Flower as a task of its own (``workers/events.py``),
        child of the delivered message's ``task_id``, on node ``hostname``; each step is a
        trace span continuing ``traceparent`` (the delivered message's), then the previous
        step's (``ledger/tracing.py``).

        Returns the delivered step's report (what Celery records for this message)."""
        self._ensure_process_state()
        message = StepMessage.model_validate(kwargs)
        deadline = time.monotonic() + self.settings.eager_window_ms / 1000
        eager_left = self.settings.eager_steps
        delivered: StepReport | None = None
        claimed: Claim | None = None  # the next step, claimed by the previous commit
        queue = self.settings.queue  # set to the eager step's queue before it is used

        def chain() -> bool:  # may the commit claim the next step (asked before committing)
            return eager_left > 0 and time.monotonic() < deadline

        while True:
            bind_step(message.run_id, message.seq)
            with tracing.step_span(traceparent, message.run_id, message.seq):
                report, follow = self._step(message, delivered, task_id, hostname, name,
                                            queue, traceparent, chain, claimed)
                tracing.name_step(name or "onward.step", report.kind.value,
                                  report.kind in FAILED_KINDS, report.version)
                traceparent = tracing.current_context() or traceparent
            delivered = delivered or report
            claimed = report.next_claim
            if claimed is not None:  # the commit leased the next step to this worker
                name = display_name(report.workflow, report.next_step)
                queue = report.queue or queue
                eager_left -= 1
                message = StepMessage(run_id=claimed.run_id, seq=claimed.seq)
                continue
            if follow is None:
                bind_step(delivered.run_id, delivered.seq)  # Celery's line about the message
                return delivered
            run_id, seq, queue = follow
            name = display_name(report.workflow, report.next_step)
            if eager_left <= 0 or time.monotonic() >= deadline:
                self.publish(run_id, seq, queue, name, traceparent, report.priority)
                bind_step(delivered.run_id, delivered.seq)
                return delivered
            eager_left -= 1
            message = StepMessage(run_id=run_id, seq=seq)

    def _step(self, message: StepMessage, delivered: StepReport | None, task_id: str | None,
              hostname: str, name: str | None, queue: str, traceparent: str | None,
              chain: Callable[[], bool], claimed: Claim | None
              ) -> tuple[StepReport, tuple[UUID, int, str] | None]:
        """One step of ``handle``: the report, and the next message a commit asked for."""
        assert self._store is not None and self._config is not None
        assert self._events is not None
        follow: list[tuple[UUID, int, str]] = []
        eager = None
        if delivered is not None and hostname:
            eager = self._events.received(hostname, name or "",
                                          display_kwargs(message.run_id, message.seq, 1),
                                          task_id)
        started = time.perf_counter()
        try:
            report = execute_step(self._store, self.registry, self._config, message,
                                  worker=self.worker_id, publish=lambda *next_step:
                                  follow.append(next_step), count_stale=delivered is None,
                                  chain=chain, claimed=claimed)
        except Exception as exc:
            if eager is not None:
                self._events.finished(hostname, *eager, None, exc)
            if claimed is not None:
                self._give_back(claimed, exc)
            if delivered is not None:
                # An eager step failed outside its body (the ledger went away): send its
                # message now rather than leave it to the dispatcher's grace period. If
                # the step did get its lease, the message is a counted no-op.
                self.publish(message.run_id, message.seq, queue, name, traceparent)
            raise
        if report.kind is ReportKind.STALE and report.detail == StaleReason.SCHEMA_CHANGED:
            self._schema_changed()
        if self.meter is not None and (delivered is None or report.kind is not ReportKind.STALE):
            self.meter.observe(report, time.perf_counter() - started)
        if eager is not None:
            self._events.finished(hostname, *eager, report)
        return report, (follow[0] if follow else None)

    def _give_back(self, claimed: Claim, exc: Exception) -> None:
        """An eager step its previous commit claimed failed outside its body: give its lease
        back (fenced by its epoch: a no-op if the attempt already ended), so the message
        published for it next runs at once instead of waiting for the lease to expire. If
        the ledger is gone, the lease expires and the reaper restores the run."""
        assert self._store is not None and self._config is not None
        try:  # its text may quote the state or a request: sealed with keys, as a step's is
            self._store.release(claimed, seal_error(
                self._config.keys.crypt, error_record(type(exc).__name__, str(exc)),
                tenant=claimed.tenant_id, run_id=claimed.run_id, seq=claimed.seq))
        except Exception as release_error:  # the ledger went away: the reaper has it
            log.warning("could not give back an eager step's lease", run_id=str(claimed.run_id),
                        seq=claimed.seq, error=str(release_error))

    def _schema_changed(self) -> None:
        """A claim was refused because the ledger is at another schema revision than this
        code's (``onward db upgrade`` ran under the worker): tell the worker's main process
        to stop taking work (SIGTERM: Celery's warm shutdown, steps in flight finish);
        ``onward worker`` then exits with status 2 for its supervisor to restart it."""
        if self._stopping_main:
            return
        self._stopping_main = True
        log.error("stopping the worker: the ledger's schema revision is not this code's "
                  "(an upgrade ran); no step is claimed", main_pid=self.main_pid)
        os.kill(self.main_pid, signal.SIGTERM)
