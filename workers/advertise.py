"""The worker's main process tells dispatchers which version queues it serves, every third
of ``ONWARD_WORKER_QUEUE_TTL_S``, busy or idle, until it stops."""

from __future__ import annotations

import threading

import structlog

from ledger.db import database_url
from ledger.exceptions import LedgerUnavailable
from ledger.hot import HotConnection
from ledger.settings import OnwardSettings

log = structlog.get_logger("onward.worker")

_ADVERTISE = """
INSERT INTO onward.worker_queues (queue, workflow, version, seen_at)
VALUES (%(queue)s, %(workflow)s, %(version)s, onward.now())
ON CONFLICT (queue) DO UPDATE SET seen_at = onward.now()
RETURNING queue
"""


class Advertiser(threading.Thread):
    def __init__(self, settings: OnwardSettings, queues: list[tuple[str, str, int]]) -> None:
        super().__init__(name="onward-advertiser", daemon=True)
        self.settings = settings
        self.queues = queues
        self.stopping = threading.Event()
        self.url = database_url(settings)

    def advertise(self) -> None:
        # A short-lived connection: nothing of it must survive into forked pool children.
        conn = HotConnection(self.url)
        try:
            for queue, workflow, version in self.queues:
                conn.one(_ADVERTISE, {"queue": queue, "workflow": workflow, "version": version})
        finally:
            conn.close()

    def run(self) -> None:
        interval = self.settings.worker_queue_ttl_s / 3
        while not self.stopping.is_set():
            try:
                self.advertise()
            except LedgerUnavailable as exc:
                log.warning("could not advertise version queues", error=str(exc))
            self.stopping.wait(interval)
