"""One clock: every time the ledger compares or records is ``onward.now()``, the database's
time, which tests may move forward by a session offset (docs/design.md section 13, invariant 7)."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import sqlalchemy as sa

from ledger import Ledger
from ledger.db import libpq_conninfo
from tests.support import clock


def test_clock__onward_now_is_now_plus_the_session_offset(ledger: Ledger) -> None:
    """Without the setting, onward.now() is now(); with an offset of a day, every default
    timestamp the ledger writes (a new run's created_at) is a day ahead of now()."""
    with psycopg.connect(libpq_conninfo(ledger.url), autocommit=True) as conn:
        drift = conn.execute("SELECT extract(epoch FROM onward.now() - now())").fetchone()
        assert drift is not None and float(drift[0]) == 0.0
        clock.set_on_raw(conn, timedelta(days=1))
        ahead = conn.execute("SELECT extract(epoch FROM onward.now() - now())").fetchone()
        assert ahead is not None and float(ahead[0]) == 86400.0
    offset = [timedelta(days=1)]
    engine = sa.create_engine(ledger.url)
    clock.follow_engine(engine, offset)
    try:
        moved = Ledger(engine, ledger.settings)
        run_id = moved.start_run("test_chain", {"steps": 1})
        with engine.connect() as conn:
            lag = conn.execute(sa.text(
                "SELECT extract(epoch FROM created_at - now()) FROM onward.runs WHERE id = :id"),
                {"id": run_id}).scalar_one()
        assert 86000 < float(lag) <= 86400.5
    finally:
        engine.dispose()
