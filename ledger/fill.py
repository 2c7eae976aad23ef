"""Bulk synthetic history for benchmarks (bench/console.py): plain INSERT … SELECT from
``generate_series``, so a ledger of 100,000 runs fills in seconds. The rows are shaped like
real ones for the console's reads; their checkpoint MACs are placeholders and do not verify.
Never point this at a database that holds real runs."""

from __future__ import annotations

from uuid import UUID

from sqlalchemy.engine import Connection

from ledger import sql

__all__ = ["fill_approvals_txn", "fill_long_run_txn", "fill_runs_txn"]


_RUNS = sql.text("fill_runs")
_APPROVALS = sql.text("fill_approvals")
_LONG_RUN = sql.text("fill_long_run")


def fill_runs_txn(conn: Connection, tenant_id: str, count: int) -> None:
    """``count`` runs of two workflows in a mix of statuses, newest last."""
    conn.execute(_RUNS, {"tenant": tenant_id, "n": count})


def fill_approvals_txn(conn: Connection, tenant_id: str, count: int) -> None:
    """The newest ``count`` runs wait, each for one pending approval."""
    conn.execute(_APPROVALS, {"tenant": tenant_id, "n": count})


def fill_long_run_txn(conn: Connection, tenant_id: str, run_id: UUID, steps: int) -> None:
    """One run with ``steps`` committed steps (checkpoints and step executions)."""
    conn.execute(_LONG_RUN, {"tenant": tenant_id, "run_id": run_id, "steps": steps})
