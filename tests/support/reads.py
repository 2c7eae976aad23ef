"""Read-only views of the ledger for assertions: what the outside world can count.

Tests assert on rows, not on return values of the code under test, so these helpers read
the tables directly with plain SQL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ledger.db import libpq_conninfo
from ledger.schema import metadata


@dataclass(frozen=True)
class Fingerprint:
    """Counts over the whole ledger: equal before and after means nothing changed."""

    runs: int
    seq_sum: int
    attempts_total: int
    stale_deliveries: int
    restores: int
    lease_epochs: int
    checkpoints: int
    step_attempts: int
    outbox: int


def fingerprint(engine: Engine) -> Fingerprint:
    with engine.connect() as conn:
        row = conn.execute(sa.text("""
            SELECT (SELECT count(*) FROM onward.runs) AS runs,
                   (SELECT coalesce(sum(seq), 0) FROM onward.runs) AS seq_sum,
                   (SELECT coalesce(sum(attempts_total), 0) FROM onward.runs) AS attempts_total,
                   (SELECT coalesce(sum(stale_deliveries), 0) FROM onward.runs)
                       AS stale_deliveries,
                   (SELECT coalesce(sum(restore_count), 0) FROM onward.runs) AS restores,
                   (SELECT coalesce(sum(lease_epoch), 0) FROM onward.runs) AS lease_epochs,
                   (SELECT count(*) FROM onward.checkpoints) AS checkpoints,
                   (SELECT count(*) FROM onward.step_attempts) AS step_attempts,
                   (SELECT count(*) FROM onward.outbox) AS outbox
        """)).mappings().one()
    return Fingerprint(**{name: int(row[name]) for name in Fingerprint.__dataclass_fields__})


def run_row(engine: Engine, run_id: UUID) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT * FROM onward.runs WHERE id = :id"),
                                 {"id": run_id}).mappings().one())


def checkpoint_seqs(engine: Engine, run_id: UUID) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(
            "SELECT seq FROM onward.checkpoints WHERE run_id = :id ORDER BY seq"),
            {"id": run_id}).scalars())


def attempts(engine: Engine, run_id: UUID) -> list[dict[str, Any]]:
    """Every claimed execution of a step of the run, in lease order."""
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM onward.step_attempts WHERE run_id = :id ORDER BY lease_epoch"),
            {"id": run_id}).mappings()]


def committed_per_seq(engine: Engine, run_id: UUID) -> dict[int, int]:
    """seq -> how many attempts at that seq ended 'committed' (must be 1 each)."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text("""
            SELECT seq, count(*) AS n FROM onward.step_attempts
             WHERE run_id = :id AND outcome = 'committed' GROUP BY seq ORDER BY seq"""),
            {"id": run_id}).all()
    return {int(seq): int(n) for seq, n in rows}


def outbox_rows(engine: Engine, run_id: UUID) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM onward.outbox WHERE run_id = :id ORDER BY seq"),
            {"id": run_id}).mappings()]


def execute(engine: Engine, sql: str, **params: Any) -> int:
    """Run one data-modifying statement (tests that tamper with the ledger); rowcount."""
    with engine.begin() as conn:
        return conn.execute(sa.text(sql), params).rowcount


def wait_run(engine: Engine, run_id: UUID, *, timeout: float, what: str,
             until: Any = None, status: str | None = None) -> dict[str, Any]:
    """Poll the run's row until ``until(row)`` (or its status) holds; fail showing the row."""
    from tests.support.cluster import wait_for

    def check() -> dict[str, Any] | None:
        row = run_row(engine, run_id)
        if status is not None and row["status"] != status:
            return None
        if until is not None and not until(row):
            return None
        return row

    def seen() -> dict[str, Any]:
        row = run_row(engine, run_id)
        keys = ("status", "seq", "step", "attempt", "attempts_total", "lease_owner",
                "lease_epoch", "restore_count", "stale_deliveries", "parked_reason",
                "last_error")
        return {key: row[key] for key in keys}

    return wait_for(check, timeout=timeout, what=what, interval=0.1, seen=seen)


def checkpoint_outcomes(engine: Engine, run_id: UUID) -> list[str]:
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(sa.text(
            "SELECT outcome FROM onward.checkpoints WHERE run_id = :id ORDER BY seq"),
            {"id": run_id})]


def live_queues(engine: Engine, within_s: float = 3.0) -> list[str]:
    """Version queues some worker advertised recently."""
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(sa.text(
            "SELECT queue FROM onward.worker_queues "
            "WHERE seen_at > now() - :s * interval '1 second'"), {"s": within_s})]


def audit_rows(engine: Engine, run_id: UUID) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM onward.audit WHERE run_id = :id ORDER BY id"), {"id": run_id})
            .mappings()]


def checkpoint_kinds(engine: Engine, run_id: UUID) -> dict[int, str]:
    """How each checkpoint of the run stores its state: snapshot, delta or compacted."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT seq, CASE WHEN state_delta IS NOT NULL THEN 'delta' "
            "WHEN state IS NOT NULL THEN 'snapshot' ELSE 'compacted' END AS kind "
            "FROM onward.checkpoints WHERE run_id = :run ORDER BY seq"), {"run": run_id}).all()
    return {seq: kind for seq, kind in rows}


def places_holding(url: str, text: str) -> list[str]:
    """Every onward table with a row holding ``text`` in a value as stored (JSON, text,
    bytes), once each: where a secret or a plain personal value could be read."""
    found = []
    with psycopg.connect(libpq_conninfo(url)) as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(f"SELECT * FROM onward.{table.name}"):
                blob = b"".join(bytes(v) if isinstance(v, bytes | memoryview)
                                else json.dumps(v, default=str).encode() for v in row)
                if text.encode() in blob:
                    found.append(table.name)
                    break
    return found
