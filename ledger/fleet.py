"""The worker fleet as the ledger sees it: what each live worker advertises, and the
workflows with active runs that no live worker serves (``onward workers``).

A worker's main process writes its row every third of ``ONWARD_WORKER_QUEUE_TTL_S``
(``workers/advertise.py``); a row not refreshed within that TTL is a worker that stopped or
died. A clean shutdown deletes its row; rows older than a day are pruned by the next
advertisement of any worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from ledger import sql
from ledger.hot import HotConnection

__all__ = ["UNSERVED_SQL", "FleetStore", "Unserved", "WorkerAd", "WorkerRow"]


_ADVERTISE_QUEUE = sql.statement("advertise_queue")
_ADVERTISE_WORKER = sql.statement("advertise_worker")
_RETIRE = sql.statement("retire_worker")
_WORKERS = sql.statement("workers")

UNSERVED_SQL = sql.statement("unserved_runs")


@dataclass(frozen=True)
class WorkerAd:
    """What one worker's main process tells the ledger about itself."""

    node: str
    host: str
    pid: int
    pool: str
    concurrency: int
    queues: list[str]
    workflows: list[dict[str, Any]]  # {"workflow", "version", "start_step"}
    in_flight: int = 0


@dataclass(frozen=True)
class WorkerRow:
    node: str
    host: str
    pid: int
    pool: str
    concurrency: int
    queues: list[str]
    workflows: list[dict[str, Any]]
    in_flight: int
    started_at: datetime
    seen_at: datetime
    age_s: float
    live: bool

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> WorkerRow:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Unserved:
    """Active runs of a workflow (version) that no live worker can run."""

    workflow: str
    version: int | None
    runs: int
    workflow_served: bool  # some live worker has the workflow, not this version

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Unserved:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


class FleetStore:
    """Advertisements and the fleet view, one statement each on a short-lived connection."""

    def __init__(self, url: str) -> None:
        self._url = url

    def advertise(self, ad: WorkerAd | None, queues: list[tuple[str, str, int, str | None]],
                  schemas: dict[tuple[str, int], dict[str, Any]] | None = None) -> None:
        """Refresh this worker's row and its (queue, workflow, version, start step) rows,
        with the JSON Schema of each version's state model (``start_run`` checks inputs)."""
        schemas = schemas or {}
        # A short-lived connection: nothing of it must survive into forked pool children.
        conn = HotConnection(self._url)
        try:
            for queue, workflow, version, start_step in queues:
                schema = schemas.get((workflow, version))
                conn.one(_ADVERTISE_QUEUE, {"queue": queue, "workflow": workflow,
                                            "version": version, "start_step": start_step,
                                            "state_schema": Jsonb(schema) if schema else None})
            if ad is not None:
                conn.one(_ADVERTISE_WORKER, {
                    "node": ad.node, "host": ad.host, "pid": ad.pid, "pool": ad.pool,
                    "concurrency": ad.concurrency, "queues": Jsonb(ad.queues),
                    "workflows": Jsonb(ad.workflows), "in_flight": ad.in_flight})
        finally:
            conn.close()

    def retire(self, node: str, pid: int) -> None:
        """A worker that stops cleanly removes its row (a dead one's row simply ages)."""
        conn = HotConnection(self._url)
        try:
            conn.one(_RETIRE, {"node": node, "pid": pid})
        finally:
            conn.close()

    def workers(self, *, within_s: float) -> list[WorkerRow]:
        conn = HotConnection(self._url)
        try:
            return [WorkerRow.from_row(r) for r in conn.all(_WORKERS, {"within": within_s})]
        finally:
            conn.close()

    def unserved(self, *, within_s: float) -> list[Unserved]:
        conn = HotConnection(self._url)
        try:
            return [Unserved.from_row(r) for r in conn.all(UNSERVED_SQL, {"within": within_s})]
        finally:
            conn.close()
