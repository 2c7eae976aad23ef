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

from ledger.hot import HotConnection

_ADVERTISE_QUEUE = """
INSERT INTO onward.worker_queues (queue, workflow, version, seen_at, start_step, state_schema)
VALUES (%(queue)s, %(workflow)s, %(version)s, onward.now(), %(start_step)s, %(state_schema)s)
ON CONFLICT (queue) DO UPDATE SET seen_at = onward.now(), start_step = EXCLUDED.start_step,
                                  state_schema = EXCLUDED.state_schema
RETURNING queue
"""

_ADVERTISE_WORKER = """
WITH pruned AS (
    DELETE FROM onward.workers WHERE seen_at < onward.now() - interval '1 day'
)
INSERT INTO onward.workers (node, host, pid, pool, concurrency, queues, workflows, in_flight,
                            started_at, seen_at)
VALUES (%(node)s, %(host)s, %(pid)s, %(pool)s, %(concurrency)s, %(queues)s, %(workflows)s,
        %(in_flight)s, onward.now(), onward.now())
ON CONFLICT (node) DO UPDATE
   SET host = EXCLUDED.host, pid = EXCLUDED.pid, pool = EXCLUDED.pool,
       concurrency = EXCLUDED.concurrency, queues = EXCLUDED.queues,
       workflows = EXCLUDED.workflows, in_flight = EXCLUDED.in_flight,
       -- a new main process under the same node name is a restart
       started_at = CASE WHEN onward.workers.pid = EXCLUDED.pid
                         THEN onward.workers.started_at ELSE onward.now() END,
       seen_at = onward.now()
RETURNING node
"""

_RETIRE = "DELETE FROM onward.workers WHERE node = %(node)s AND pid = %(pid)s RETURNING node"

_WORKERS = """
SELECT node, host, pid, pool, concurrency, queues, workflows, in_flight, started_at, seen_at,
       extract(epoch FROM onward.now() - seen_at)::float8 AS age_s,
       seen_at > onward.now() - %(within)s * interval '1 second' AS live
  FROM onward.workers ORDER BY host, node
"""

# Active runs by workflow and version (the status index holds the few that are not
# terminal), against what live workers advertise: a workflow no live worker has, or a version
# no live worker has, is unserved.
UNSERVED_SQL = """
WITH served AS (
    SELECT DISTINCT workflow, version FROM onward.worker_queues
     WHERE seen_at > onward.now() - %(within)s * interval '1 second'
), active AS (
    SELECT workflow, workflow_version, count(*) AS runs FROM onward.runs
     WHERE status IN ('running', 'waiting')
     GROUP BY workflow, workflow_version
)
SELECT a.workflow, a.workflow_version AS version, a.runs,
       EXISTS (SELECT 1 FROM served s WHERE s.workflow = a.workflow) AS workflow_served
  FROM active a
 WHERE NOT EXISTS (SELECT 1 FROM served s WHERE s.workflow = a.workflow
                     AND (a.workflow_version IS NULL OR s.version = a.workflow_version))
 ORDER BY a.workflow, a.workflow_version
"""


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
