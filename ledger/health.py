"""Numbers about the ledger for monitoring (docs/design.md section 11, docs/runbook.md), per
workflow and version, never per run.

A scrape costs the same whatever the ledger's history: counters are read from
``metric_totals`` (a few rows per workflow version, added to by each worker process every few
seconds: ``add_totals``); gauges count only what is active (runs running, waiting or parked,
unresolved effects, the outbox, pending approvals, restores), each through an index on the
column that selects them. ``bench/metrics.py`` measures a scrape of a ledger holding a
million steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from psycopg.types.json import Jsonb
from sqlalchemy.engine import Connection, Engine

from ledger.db import wrap_driver_errors
from ledger.hot import HotConnection
from ledger.vocabulary import RunStatus

# Counters' keys: (workflow, version, metric, label).
TotalKey = tuple[str, int, str, str]

_ADD_TOTALS = """
INSERT INTO onward.metric_totals (workflow, version, metric, label, value, updated_at)
SELECT t.workflow, t.version, t.metric, t.label, t.value, onward.now()
  FROM jsonb_to_recordset(%(rows)s) AS t(workflow text, version int, metric text, label text,
                                         value float8)
 ORDER BY 1, 2, 3, 4  -- one lock order for every writer: no deadlock between two flushes
ON CONFLICT (workflow, version, metric, label)
DO UPDATE SET value = onward.metric_totals.value + EXCLUDED.value, updated_at = onward.now()
RETURNING 1
"""

_TOTALS = sa.text("SELECT workflow, version, metric, label, value FROM onward.metric_totals")

# Runs that are not terminal, through ix_runs_status_lease (status first). For parked runs
# the reason, for waiting runs what they wait for (approval, signal, effect, …).
_ACTIVE_RUNS = sa.text("""
SELECT workflow, coalesce(workflow_version, 0) AS version, status,
       CASE status WHEN 'needs_review' THEN coalesce(parked_reason, 'unknown')
                   WHEN 'waiting' THEN coalesce(split_part(waiting_on, ':', 1), 'unknown')
                   ELSE '' END AS why,
       count(*) AS n
  FROM onward.runs WHERE status IN ('running', 'waiting', 'needs_review')
 GROUP BY 1, 2, 3, 4
""")

_RESTORES = sa.text("""
SELECT r.workflow, coalesce(r.workflow_version, 0) AS version, count(*) AS n
  FROM onward.step_attempts a JOIN onward.runs r ON r.id = a.run_id
 WHERE a.outcome = 'worker_lost'
 GROUP BY 1, 2
""")

_EFFECTS = sa.text("""
SELECT r.workflow, coalesce(r.workflow_version, 0) AS version, e.status, count(*) AS n,
       extract(epoch FROM onward.now() - min(e.updated_at))::float8 AS oldest_s
  FROM onward.effects e JOIN onward.runs r ON r.id = e.run_id
 WHERE e.status IN ('pending', 'accepted')
 GROUP BY 1, 2, 3
""")

# Due rows, and how long the oldest has waited for a publish it should have had: rows the
# dispatcher owns at once, rows a worker publishes itself after the grace period.
_OUTBOX = sa.text("""
SELECT r.workflow, coalesce(r.workflow_version, 0) AS version, count(*) AS due,
       coalesce(extract(epoch FROM onward.now() - min(o.due_at) FILTER (
           WHERE o.published_at IS NULL
             AND (NOT o.worker_publishes
                  OR o.created_at < onward.now() - :grace * interval '1 second'))), 0)::float8
           AS lag_s
  FROM onward.outbox o JOIN onward.runs r ON r.id = o.run_id
 WHERE o.due_at <= onward.now()
 GROUP BY 1, 2
""")

# Pending approvals by workflow are the runs waiting on one (_ACTIVE_RUNS, kind approval);
# the oldest comes from the partial index on pending approvals, with no join to runs.
_APPROVALS = sa.text("""
SELECT count(*) AS n,
       coalesce(extract(epoch FROM onward.now() - min(created_at)), 0)::float8 AS oldest_s
  FROM onward.approvals WHERE status = 'pending'
""")

_SERVED = sa.text("""
SELECT DISTINCT workflow, version FROM onward.worker_queues
 WHERE seen_at > onward.now() - :within * interval '1 second'
""")

_LIVE_WORKERS = sa.text("""
SELECT count(*) AS n, coalesce(sum(in_flight), 0) AS in_flight FROM onward.workers
 WHERE seen_at > onward.now() - :within * interval '1 second'
""")


@dataclass(frozen=True)
class QuotaUse:
    """Slots of one quota in use now, and its limit (None: unlimited)."""

    quota: str
    in_use: int
    limit: int | None = None


# Where quota slots come from once quotas exist: each probe reads its own table in the
# scrape's transaction (one indexed query) and says what is in use.
QUOTA_PROBES: list[Callable[[Connection], list[QuotaUse]]] = []


@dataclass(frozen=True)
class Health:
    totals: list[dict[str, Any]]  # workflow, version, metric, label, value
    active_runs: list[dict[str, Any]]  # workflow, version, status, why, n
    restores: list[dict[str, Any]]  # workflow, version, n
    effects: list[dict[str, Any]]  # workflow, version, status, n, oldest_s
    outbox: list[dict[str, Any]]  # workflow, version, due, lag_s
    approvals_pending: int
    oldest_approval_s: float
    workers_live: int
    steps_in_flight: int
    unserved: list[dict[str, Any]]  # workflow, version, runs, workflow_served
    quotas: list[QuotaUse] = field(default_factory=list)


def _rows(conn: Connection, query: Any, **params: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(query, params).mappings()]


def health_txn(conn: Connection, *, worker_ttl_s: float = 30.0,
               outbox_grace_s: float = 30.0) -> Health:
    """One scrape: a handful of indexed queries in the caller's (read-only) transaction."""
    live = conn.execute(_LIVE_WORKERS, {"within": worker_ttl_s}).mappings().one()
    approvals = conn.execute(_APPROVALS).mappings().one()
    active = _rows(conn, _ACTIVE_RUNS)
    served = {(r["workflow"], r["version"]) for r in _rows(conn, _SERVED,
                                                          within=worker_ttl_s)}
    return Health(
        totals=_rows(conn, _TOTALS),
        active_runs=active,
        restores=_rows(conn, _RESTORES),
        effects=_rows(conn, _EFFECTS),
        outbox=_rows(conn, _OUTBOX, grace=outbox_grace_s),
        approvals_pending=int(approvals["n"]),
        oldest_approval_s=float(approvals["oldest_s"]),
        workers_live=int(live["n"]),
        steps_in_flight=int(live["in_flight"]),
        unserved=_unserved(active, served),
        quotas=[use for probe in QUOTA_PROBES for use in probe(conn)],
    )


def read_health(engine: Engine, *, worker_ttl_s: float = 30.0,
                outbox_grace_s: float = 30.0) -> Health:
    """One scrape (``health_txn``) on a connection of its own; driver errors wrapped."""
    with wrap_driver_errors("reading metrics"), engine.connect() as conn:
        return health_txn(conn, worker_ttl_s=worker_ttl_s, outbox_grace_s=outbox_grace_s)


def _unserved(active: list[dict[str, Any]], served: set[tuple[str, int]]
              ) -> list[dict[str, Any]]:
    """Active runs whose workflow (version 0: not bound yet) no live worker advertises, as
    ``onward workers`` flags them (ledger/fleet.py)."""
    workflows = {w for w, _ in served}
    counts: dict[tuple[str, int], int] = {}
    for row in active:
        key = (row["workflow"], row["version"])
        if row["status"] == RunStatus.NEEDS_REVIEW:
            continue  # a person looks first, whoever serves it
        if key in served or (row["version"] == 0 and row["workflow"] in workflows):
            continue
        counts[key] = counts.get(key, 0) + int(row["n"])
    return [{"workflow": w, "version": v, "runs": n} for (w, v), n in sorted(counts.items())]


def add_totals(conn: HotConnection, deltas: dict[TotalKey, float]) -> None:
    """Add a worker process's counts since its last flush (one statement)."""
    if not deltas:
        return
    rows = [{"workflow": w, "version": v, "metric": m, "label": label, "value": value}
            for (w, v, m, label), value in sorted(deltas.items())]
    conn.one(_ADD_TOTALS, {"rows": Jsonb(rows)})
