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

from psycopg.types.json import Jsonb
from sqlalchemy.engine import Connection, Engine

from ledger import sql
from ledger.db import wrap_driver_errors
from ledger.hot import HotConnection
from ledger.limits import LimitState, limit_states_txn
from ledger.vocabulary import RunStatus

__all__ = [
    "QUOTA_PROBES",
    "Health",
    "QuotaUse",
    "TotalKey",
    "add_totals",
    "health_txn",
    "read_health",
]


# Counters' keys: (workflow, version, metric, label).
TotalKey = tuple[str, int, str, str]

_ADD_TOTALS = sql.statement("add_totals")
_TOTALS = sql.text("totals")
_ACTIVE_RUNS = sql.text("active_runs")
_RESTORES = sql.text("restores")
_EFFECTS = sql.text("unresolved_effects_by_version")
_OUTBOX = sql.text("outbox_lag")
_APPROVALS = sql.text("pending_approvals")
_SERVED = sql.text("served_versions")
_LIVE_WORKERS = sql.text("live_workers")


@dataclass(frozen=True)
class QuotaUse:
    """Slots of one quota in use now, and its limit (None: unlimited)."""

    quota: str
    in_use: int
    limit: int | None = None


# Further sources of quota slots beside onward's own limits (docs/limits.md): each probe
# reads its own table in the scrape's transaction (one indexed query) and says what is in use.
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
    limits: list[LimitState] = field(default_factory=list)  # fleet-wide limits, with use


def _rows(conn: Connection, query: Any, **params: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(query, params).mappings()]


def health_txn(conn: Connection, *, worker_ttl_s: float = 30.0,
               outbox_grace_s: float = 30.0) -> Health:
    """One scrape: a handful of indexed queries in the caller's (read-only) transaction."""
    live = conn.execute(_LIVE_WORKERS, {"within": worker_ttl_s}).mappings().one()
    limits = limit_states_txn(conn)
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
        quotas=[*(QuotaUse(state.key, state.in_use, state.concurrency) for state in limits),
                *(use for probe in QUOTA_PROBES for use in probe(conn))],
        limits=limits,
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
