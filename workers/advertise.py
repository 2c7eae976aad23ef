"""The worker's main process tells dispatchers which version queues it serves, and the fleet
view (``onward workers``) who it is, every third of ``ONWARD_WORKER_QUEUE_TTL_S``, busy or
idle, until it stops; a clean stop removes its worker row. With each workflow version goes
the JSON Schema of its state model, which ``start_run`` checks new runs' input against."""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Any

import structlog

from ledger.db import RevisionWatch, database_url
from ledger.exceptions import LedgerUnavailable, SchemaMismatch
from ledger.fleet import FleetStore, WorkerAd
from workers.settings import WorkerSettings

__all__ = ["Advertiser", "steps_in_flight"]


log = structlog.get_logger("onward.worker")


def steps_in_flight() -> int:
    """Step messages this worker's pool is executing now (main process: Celery's own list)."""
    from celery.worker import state

    return len(state.active_requests)


class Advertiser(threading.Thread):
    def __init__(self, settings: WorkerSettings, queues: list[tuple[str, str, int, str | None]],
                 *, node: str = "", pool: str = "prefork", concurrency: int = 0,
                 all_queues: list[str] | None = None,
                 schemas: dict[tuple[str, int], dict[str, Any]] | None = None) -> None:
        super().__init__(name="onward-advertiser", daemon=True)
        self.settings = settings
        self.queues = queues
        self.node = node
        self.pool = pool
        self.concurrency = concurrency
        self.all_queues = all_queues or []
        self.schemas = schemas or {}  # (workflow, version) -> its state model's JSON Schema
        self.stopping = threading.Event()
        self.store = FleetStore(database_url(settings))
        self.revision = RevisionWatch(database_url(settings), settings.schema_check_s)
        self.schema_changed: str | None = None  # why the worker was told to stop

    def _ad(self) -> WorkerAd | None:
        if not self.node:
            return None
        workflows = [{"workflow": w, "version": v, "start_step": s}
                     for _, w, v, s in self.queues if v]
        return WorkerAd(node=self.node, host=socket.gethostname(), pid=os.getpid(),
                        pool=self.pool, concurrency=self.concurrency, queues=self.all_queues,
                        workflows=workflows, in_flight=steps_in_flight())

    def advertise(self) -> None:
        self.store.advertise(self._ad(), self.queues, self.schemas)

    def retire(self, wait_s: float = 10.0) -> None:
        """Remove this worker's row (called on a clean shutdown). The advertising thread is
        stopped first and waited for (up to ``wait_s``): an advertisement under way when the
        worker stops would otherwise write the row back after its removal, and the stopped
        worker would be listed as live until its row aged out."""
        self.stopping.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(wait_s)
        if self.node:
            try:
                self.store.retire(self.node, os.getpid())
            except LedgerUnavailable as exc:
                log.warning("could not remove the worker's row", error=str(exc))

    def run(self) -> None:
        interval = min(self.settings.worker_queue_ttl_s / 3, self.settings.schema_check_s)
        while not self.stopping.is_set():
            try:
                self.revision.check()
                self.advertise()
            except LedgerUnavailable as exc:
                log.warning("could not advertise version queues", error=str(exc))
            except SchemaMismatch as exc:
                self.stop_worker(str(exc))
                return
            self.stopping.wait(interval)

    def stop_worker(self, why: str) -> None:
        """The ledger was upgraded under this worker: stop taking work (Celery's warm
        shutdown: steps in flight finish, no new message is taken); the ``onward worker``
        command then exits with status 2 and ``why``, for its supervisor to restart it on
        the new code."""
        if self.schema_changed is None:
            self.schema_changed = why
            log.error("stopping the worker: the ledger's schema changed", detail=why)
            os.kill(os.getpid(), signal.SIGTERM)
