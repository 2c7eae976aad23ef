"""Time partitions of the append-only tables (issue 15 item 5; docs/operating.md#retention,
docs/scaling.md#when-to-partition-and-which-tables).

``step_attempts`` is partitioned by month of ``started_at`` (migration 0038): one table per
calendar month (UTC), ``step_attempts_YYYY_MM``, and a default partition that catches a row
of a month not created yet (nothing is refused for want of a partition). Partitions are made
ahead: the migration makes this month's and the next three, the reaper keeps
``MONTHS_AHEAD`` ahead at each retention pass (``ensure``); a month created after rows for it
reached the default partition takes them over.

Expiring a month is dropping its partition (``expire``), one statement and no per-row WAL,
and only when the retention policies let go of every row in it: every run with an attempt
in that month is terminal, finished longer ago than its policy's days, and neither on legal
hold nor pinned in a corpus (a run without a policy is kept forever, and so is the month).
Only a month that has ended is dropped. Each drop writes, in the same transaction, one
audit row per tenant whose attempts it removed (action ``retention``, details naming the
partition and the count). The functions that create and drop partitions run with the
owner's rights and only ``onward_operator`` (the reaper) may call them: a role that sees one
tenant could not tell whether another tenant's runs keep a month.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ledger.audit import Actor, AuditRecord, record_txn
from ledger.checkpoints import CheckpointKeys
from ledger.db import wrap_driver_errors
from ledger.retention import (
    REAPER_ACTOR,
    TERMINAL,
    Kind,
    Policy,
    days_for,
    keep_exclusive_txn,
)
from ledger.vocabulary import AuditAction, AuditOutcome, Role

__all__ = [
    "MONTHS_AHEAD",
    "PARTITIONED",
    "Expired",
    "Partition",
    "ensure",
    "expire",
    "partitions_txn",
    "plan_txn",
    "why_kept_txn",
]


PARTITIONED = {"step_attempts": "started_at"}
"""Each table partitioned by month, and its partition key."""
MONTHS_AHEAD = 3

_LIST = """
SELECT c.relname AS name,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \\(''([^'']+)''\\)')::timestamptz
           AS lo,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \\(''([^'']+)''\\)')::timestamptz
           AS hi
  FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = to_regclass(:parent)
 ORDER BY lo NULLS LAST
"""

_KEEPERS = """
SELECT r.tenant_id, r.workflow, count(*) AS runs,
       bool_and(r.status IN :terminal) AS all_terminal,
       max(r.finished_at) AS last_finished,
       bool_or(r.legal_hold IS NOT NULL) AS held,
       bool_or(EXISTS (SELECT 1 FROM onward.corpus_runs p WHERE p.run_id = r.id)) AS pinned
  FROM (SELECT DISTINCT run_id FROM onward.{table} WHERE {key} >= :lo AND {key} < :hi) a
  JOIN onward.runs r ON r.id = a.run_id
 GROUP BY r.tenant_id, r.workflow
"""
"""Per tenant and workflow, the runs with rows in a month: are they all let go? (A row whose
run was deleted went with it: ON DELETE CASCADE.)"""


@dataclass(frozen=True)
class Partition:
    table: str
    name: str
    lo: datetime | None  # None: the default partition
    hi: datetime | None


@dataclass
class Expired:
    dropped: list[str] = field(default_factory=list)
    rows: int = 0
    kept: dict[str, str] = field(default_factory=dict)  # partition -> why it stays

    def as_dict(self) -> dict[str, Any]:
        return {"dropped": self.dropped, "rows": self.rows, "kept": self.kept}


def partitions_txn(conn: Connection, table: str) -> list[Partition]:
    """The partitions of ``onward.table``, oldest first, the default last."""
    rows = conn.execute(sa.text(_LIST), {"parent": f"onward.{table}"}).all()
    return [Partition(table, r.name, r.lo, r.hi) for r in rows]


def ensure(engine: Engine, months_ahead: int = MONTHS_AHEAD) -> list[str]:
    """Create this month's and the next ``months_ahead`` months' partitions of every
    partitioned table that are missing (and of any month the default partition holds rows
    of); the names created."""
    made: list[str] = []
    with wrap_driver_errors("creating partitions"), engine.begin() as conn:
        for table in PARTITIONED:
            made += conn.execute(sa.text("SELECT onward.ensure_partitions(:t, :n)"),
                                 {"t": table, "n": months_ahead}).scalars().all()
    return made


def why_kept_txn(conn: Connection, policies: list[Policy], part: Partition,
                 now: datetime) -> str | None:
    """Why the retention policies keep some row of ``part`` (None: every row may go)."""
    if part.lo is None or part.hi is None:
        return "the default partition is never dropped"
    if part.hi > _month_start(now):
        return "the month has not ended"
    sql = _KEEPERS.format(table=part.table, key=PARTITIONED[part.table])
    groups = conn.execute(sa.text(sql).bindparams(sa.bindparam("terminal", expanding=True)),
                          {"terminal": list(TERMINAL), "lo": part.lo, "hi": part.hi}).all()
    for g in groups:
        scope = f"{g.tenant_id}/{g.workflow}"
        days = days_for(policies, g.tenant_id, g.workflow, Kind.ATTEMPTS)
        if days is None:
            return f"{scope}: no retention policy (kept forever)"
        if not g.all_terminal:
            return f"{scope}: a run with attempts in it has not finished"
        if g.held:
            return f"{scope}: a run is on legal hold"
        if g.pinned:
            return f"{scope}: a run is pinned in a corpus"
        if (now - g.last_finished).total_seconds() < days * 86400:
            return f"{scope}: a run finished less than {days:g} days ago"
    return None


def _month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def plan_txn(conn: Connection, policies: list[Policy]) -> dict[str, str | None]:
    """Each ended month's partition and why it is kept (None: ``expire`` drops it)."""
    if not _may_drop(conn):
        return {"*": _NOT_OPERATOR}
    now = _now(conn)
    return {p.name: why_kept_txn(conn, policies, p, now)
            for table in PARTITIONED for p in partitions_txn(conn, table)
            if p.hi is not None and p.hi <= _month_start(now)}


_NOT_OPERATOR = ("this database role may not drop partitions: connect as onward_operator, "
                 "which sees every tenant's runs")


def _may_drop(conn: Connection) -> bool:
    """Whether this role may drop partitions (only one that sees every tenant's runs can
    tell whether a month may go)."""
    return bool(conn.execute(sa.text(
        "SELECT has_function_privilege('onward.drop_partition(text, text)', 'EXECUTE')"
    )).scalar_one())


def _now(conn: Connection) -> datetime:
    """The ledger's clock (``onward.now()``), in UTC: months are UTC months."""
    now: datetime = conn.execute(sa.text("SELECT onward.now()")).scalar_one()
    return now.astimezone(UTC)


def expire(engine: Engine, keys: CheckpointKeys, policies: list[Policy], *,
           actor: Actor | None = None) -> Expired:
    """Drop every ended month's partition whose rows the policies all let go, each in its
    own transaction with its audit rows (one per tenant it held rows of), by ``actor`` (the
    reaper by default). The check, the drop and the audit rows are one transaction, under
    ``retention.KEEP_LOCK``: a legal hold or corpus pin is either seen by the check or
    made after the drop committed."""
    done = Expired()
    if not policies:
        return done
    with wrap_driver_errors("listing partitions"), engine.connect() as conn:
        parts = [p for table in PARTITIONED for p in partitions_txn(conn, table)]
        allowed = _may_drop(conn)
    if not allowed:
        done.kept["*"] = _NOT_OPERATOR
        return done
    for part in parts:
        if part.hi is None:
            continue
        with wrap_driver_errors("expiring a partition"), engine.begin() as conn:
            keep_exclusive_txn(conn)  # a hold or pin in progress commits first, or waits
            now = _now(conn)
            why = why_kept_txn(conn, policies, part, now)
            if why is not None:
                if part.hi <= _month_start(now):
                    done.kept[part.name] = why
                continue
            tenants = conn.execute(sa.text(
                f"SELECT r.tenant_id, count(*) FROM onward.{part.table} a "
                f"JOIN onward.runs r ON r.id = a.run_id "
                f"WHERE a.{PARTITIONED[part.table]} >= :lo AND a.{PARTITIONED[part.table]} < :hi "
                f"GROUP BY r.tenant_id ORDER BY r.tenant_id"),
                {"lo": part.lo, "hi": part.hi}).all()
            rows = conn.execute(sa.text("SELECT onward.drop_partition(:t, :p)"),
                                {"t": part.table, "p": part.name}).scalar_one()
            for tenant, count in tenants:
                who = replace(actor or Actor(REAPER_ACTOR, Role.ADMIN, tenant), tenant_id=tenant)
                record_txn(conn, keys, who, AuditRecord(
                    AuditAction.RETENTION, AuditOutcome.DONE, "partition expired",
                    details={"partition": part.name, "table": part.table, "rows": count,
                             "from": str(part.lo), "to": str(part.hi)}))
        done.dropped.append(part.name)
        done.rows += int(rows)
    return done
