"""What Flower (and any Celery event consumer) sees of steps.

Every step message is published under the display name ``<workflow>.<step>`` (Celery's
``shadow`` name: Flower's task list shows it and filters on it) with kwargs shown as run,
seq and attempt; the message body itself stays ``{run_id, seq}``.

A step a worker runs by eager continuation (``workers/runtime.py``) had no broker message of
its own; this module sends the task events its message would have produced (received,
started, then succeeded or failed) under a task id of its own, so Flower lists it as a task
like any other, on the worker that ran it. Sending an event never fails a step: an error is
logged and the dispatcher is rebuilt on the next step.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any
from uuid import UUID, uuid4

import structlog
from celery import Celery

from tasks.executor import ReportKind, StepReport

__all__ = [
    "FAILED_KINDS",
    "START_UNKNOWN",
    "EagerEvents",
    "display_kwargs",
    "display_name",
    "trace_headers",
]


log = structlog.get_logger("onward.worker")

# Reports Flower shows as a failed task: the step did not commit and will not without
# another attempt, a person, or a different worker.
FAILED_KINDS = frozenset({ReportKind.FAILED, ReportKind.RETRY, ReportKind.PARKED,
                          ReportKind.DIVERGED})
START_UNKNOWN = "(start)"


def display_name(workflow: str | None, step: str | None) -> str:
    """``<workflow>.<step>``: the name Flower lists a step message under."""
    return f"{workflow or 'onward'}.{step or START_UNKNOWN}"


def display_kwargs(run_id: UUID | str, seq: int, attempt: int) -> str:
    """The kwargs Flower shows: run, seq and the attempt the message starts."""
    return repr({"run_id": str(run_id), "seq": seq, "attempt": attempt})


def trace_headers(traceparent: str | None) -> dict[str, str] | None:
    """Message headers carrying the trace the step's span continues (ledger/tracing.py)."""
    return {"traceparent": traceparent} if traceparent else None


class EagerEvents:
    """Task events for steps run by eager continuation, handed to a sender thread of this
    process (one per prefork child, or per threads/gevent worker): a step does not wait for
    the broker to take them. Each event carries the time it happened."""

    def __init__(self, app: Celery, on: bool = True) -> None:
        self.app = app
        self.on = on
        self._queue: queue.SimpleQueue[tuple[str, tuple[tuple[str, dict[str, Any]], ...]]] = \
            queue.SimpleQueue()
        self._pid = 0

    @property
    def enabled(self) -> bool:
        return self.on and bool(self.app.conf.worker_send_task_events)

    def _send(self, hostname: str, *events: tuple[str, dict[str, Any]]) -> None:
        if not self.enabled:
            return
        now = time.time()
        for _, fields in events:
            fields.setdefault("timestamp", now)
        if self._pid != os.getpid():  # first event of this process: start its sender
            self._pid = os.getpid()
            self._queue = queue.SimpleQueue()
            threading.Thread(target=self._sender, args=(self._queue,), daemon=True,
                             name="onward-eager-events").start()
        self._queue.put((hostname, events))

    def _sender(self, pending: queue.SimpleQueue[tuple[str, tuple[tuple[str, dict[str, Any]],
                                                                   ...]]]) -> None:
        dispatcher, hostname = None, ""
        while True:
            node, events = pending.get()
            try:
                if dispatcher is None or node != hostname:
                    dispatcher = self.app.events.Dispatcher(self.app.connection_for_write(),
                                                            node, True, None, False)
                    hostname = node
                for type_, fields in events:
                    dispatcher.send(type_, **fields)
            except Exception as exc:  # an event is never worth a step
                log.warning("could not send a task event", error=repr(exc))
                dispatcher = None

    def flush(self, timeout_s: float = 2.0) -> None:
        """Give the sender a moment to send what is queued (a process about to exit)."""
        deadline = time.monotonic() + timeout_s
        while not self._queue.empty() and time.monotonic() < deadline:
            time.sleep(0.01)

    def received(self, hostname: str, name: str, kwargsrepr: str,
                 parent_id: str | None) -> tuple[str, float]:
        """A new task id for the eager step, announced as received and started."""
        task_id = str(uuid4())
        self._send(hostname,
                   ("task-received", {"uuid": task_id, "name": name, "args": "()",
                                      "kwargs": kwargsrepr, "root_id": parent_id,
                                      "parent_id": parent_id, "retries": 0, "eta": None,
                                      "expires": None}),
                   ("task-started", {"uuid": task_id}))
        return task_id, time.monotonic()

    def finished(self, hostname: str, task_id: str, started: float,
                 report: StepReport | None, error: BaseException | None = None) -> None:
        runtime = time.monotonic() - started
        if error is not None or (report is not None and report.kind in FAILED_KINDS):
            what = repr(error) if error is not None else (
                f"StepNotCommitted({report.kind.value}: {report.detail[:200]})" if report
                else "")
            self._send(hostname, ("task-failed", {"uuid": task_id, "exception": what,
                                                  "traceback": "", "runtime": runtime}))
            return
        result = repr(report.kind.value) if report is not None else "None"
        self._send(hostname, ("task-succeeded", {"uuid": task_id, "result": result,
                                                 "runtime": runtime}))
