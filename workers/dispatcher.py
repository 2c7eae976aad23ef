"""The outbox dispatcher: publishes rows the fast path did not (or could not) publish.

Woken by LISTEN/NOTIFY, with a polling fallback; several can run (SKIP LOCKED).
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import structlog
from celery import Celery

from ledger.db import RevisionWatch, create_engine, database_url
from ledger.exceptions import LedgerUnavailable
from ledger.outbox import OutboxMessage, OutboxStore
from tasks import faults
from tasks.routing import route, workflow_queue
from workers.broker import broker_url, message_priority
from workers.events import display_kwargs, display_name, trace_headers
from workers.revision import wait_for_ledger
from workers.runtime import STEP_TASK
from workers.settings import WorkerSettings

__all__ = ["LIVE_QUEUES_REFRESH_S", "Dispatcher", "install_stop_signals", "run_dispatcher"]


log = structlog.get_logger("onward.dispatcher")

LIVE_QUEUES_REFRESH_S = 1.0


class Dispatcher:
    def __init__(self, app: Celery, settings: WorkerSettings) -> None:
        self.app = app
        self.settings = settings
        self.store = OutboxStore(
            database_url(settings),
            grace_s=settings.outbox_grace_s,
            republish_s=settings.outbox_republish_s,
            republish_max_s=settings.outbox_republish_max_s,
        )
        self.stopping = threading.Event()
        self.revision = RevisionWatch(database_url(settings), settings.schema_check_s)
        self.published = 0
        self._producer: Any = None
        self._live: set[str] = set()
        self._start_steps: dict[str, str] = {}  # workflow -> its start step (newest code)
        self._live_at = -1e9
        self._broker = broker_url(settings)

    def _live_queues(self) -> set[str]:
        now = time.monotonic()
        if now - self._live_at > LIVE_QUEUES_REFRESH_S:
            live = self.store.live_queue_starts(within_s=self.settings.worker_queue_ttl_s)
            self._live = set(live)
            self._start_steps = {workflow: start for queue, (workflow, start) in live.items()
                                 if start and queue == workflow_queue(self.settings.queue,
                                                                      workflow)}
            self._live_at = now
        return self._live

    def _name(self, message: OutboxMessage) -> str:
        """``<workflow>.<step>`` for Flower; a run's first step is named by what the live
        workers advertise as the workflow's start step."""
        return display_name(message.workflow,
                            message.step or self._start_steps.get(message.workflow))

    def publish(self, message: OutboxMessage) -> None:
        if self._producer is None:
            self._producer = self.app.producer_pool.acquire(block=True)
        queue = route(self.settings.queue, message.workflow, message.workflow_version,
                      self._live_queues())
        self.app.send_task(
            STEP_TASK,
            kwargs={"run_id": str(message.run_id), "seq": message.seq},
            queue=queue,
            producer=self._producer,
            shadow=self._name(message),
            headers=trace_headers(message.trace_context),
            argsrepr="()",
            kwargsrepr=display_kwargs(message.run_id, message.seq, message.attempt),
            priority=message_priority(message.priority, self._broker),
        )

    def sweep_once(self) -> int:
        sent = self.store.sweep(
            self.publish,
            after_publish=lambda: faults.point("dispatcher_after_publish_before_mark"),
        )
        self.published += sent
        if sent:
            log.info("published outbox rows", count=sent)
        return sent

    def run(self) -> None:
        log.info("dispatcher started", queue=self.settings.queue)
        try:
            self._loop()
        finally:
            self.store.close()
        log.info("dispatcher stopped", published=self.published)

    def _loop(self) -> None:
        while not self.stopping.is_set():
            self.revision.check()  # an upgrade ran: SchemaMismatch stops the dispatcher
            try:
                if self.sweep_once() >= 500:
                    continue  # a full batch: more may be due right now
                next_due = self.store.seconds_to_next_due()
                timeout = self.settings.dispatcher_poll_s
                if next_due is not None:
                    timeout = min(timeout, next_due)
                self.store.wait(timeout)
            except LedgerUnavailable as exc:
                log.error("ledger unavailable; retrying", error=str(exc))
                self.stopping.wait(1.0)
            except Exception as exc:
                log.error("dispatch failed; retrying", error=repr(exc))
                self._producer = None
                self.stopping.wait(1.0)


def install_stop_signals(stopping: threading.Event) -> None:
    def stop(signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def run_dispatcher(settings: WorkerSettings) -> None:
    from workers.app import create_app

    wait_for_ledger(create_engine(settings), "dispatcher")
    app = create_app(settings, registry=_no_workflows())
    dispatcher = Dispatcher(app, settings)
    install_stop_signals(dispatcher.stopping)
    dispatcher.run()


def _no_workflows() -> Any:
    from tasks.workflow import Registry

    return Registry()  # the dispatcher publishes ids; it never runs workflow code
