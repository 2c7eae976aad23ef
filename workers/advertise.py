"""The worker's main process tells dispatchers which version queues it serves, and the fleet
view (``onward workers``) who it is, every third of ``ONWARD_WORKER_QUEUE_TTL_S``, busy or
idle, until it stops; a clean stop removes its worker row. With each workflow version goes
the JSON Schema of its state model, which ``start_run`` checks new runs' input against."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import structlog

from ledger.db import database_url
from ledger.exceptions import LedgerUnavailable
from ledger.fleet import FleetStore, WorkerAd
from ledger.settings import OnwardSettings

log = structlog.get_logger("onward.worker")


def steps_in_flight() -> int:
    """Step messages this worker's pool is executing now (main process: Celery's own list)."""
    from celery.worker import state

    return len(state.active_requests)


class Advertiser(threading.Thread):
    def __init__(self, settings: OnwardSettings, queues: list[tuple[str, str, int, str | None]],
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

    def retire(self) -> None:
        """Remove this worker's row (called on a clean shutdown)."""
        self.stopping.set()
        if self.node:
            try:
                self.store.retire(self.node, os.getpid())
            except LedgerUnavailable as exc:
                log.warning("could not remove the worker's row", error=str(exc))

    def run(self) -> None:
        interval = self.settings.worker_queue_ttl_s / 3
        while not self.stopping.is_set():
            try:
                self.advertise()
            except LedgerUnavailable as exc:
                log.warning("could not advertise version queues", error=str(exc))
            self.stopping.wait(interval)
