"""ledger.db.snapshot: one REPEATABLE READ transaction, and its connection always returned."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from ledger.db import snapshot


def test_snapshot__reads_one_snapshot_read_only(database: str) -> None:
    engine = sa.create_engine(database.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with snapshot(engine) as conn:
            level = conn.execute(sa.text("SHOW transaction_isolation")).scalar()
            read_only = conn.execute(sa.text("SHOW transaction_read_only")).scalar()
        assert (level, read_only) == ("repeatable read", "on")
    finally:
        engine.dispose()


def test_snapshot__a_failure_opening_it_returns_the_connection(database: str) -> None:
    """A connection that cannot take the isolation level (here: one left inside a transaction
    at checkout, as a misbehaving pool hook would) raises, and goes back to the pool: before,
    each such call leaked a pooled connection until the pool was exhausted."""
    engine = sa.create_engine(database.replace("postgresql://", "postgresql+psycopg://", 1),
                              pool_size=1, max_overflow=0, pool_timeout=2)

    @sa.event.listens_for(engine, "checkout")
    def _leave_a_transaction_open(dbapi_conn: Any, *_: Any) -> None:
        dbapi_conn.execute("SELECT 1")  # psycopg begins a transaction and leaves it open

    try:
        for _ in range(3):  # with a pool of one, a leaked connection times out the second
            with pytest.raises((sa.exc.SQLAlchemyError, psycopg.Error)), snapshot(engine):
                pass
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        engine.dispose()
