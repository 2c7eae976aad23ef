"""Deterministic time for tests: the ledger's SQL reads ``onward.now()``, which is
``now()`` plus the session setting ``onward.clock_offset``. Production never sets it.

In-process connections are moved with ``set_offset``; processes a test starts get the
offset at connect time through libpq's ``PGOPTIONS`` (``process_env``).

``freeze`` stops the clock of one test's own database: ``onward.now()`` is then a fixed
instant plus the offset, so time passes only when the test moves it (the model-based test:
a condition on the database's time must not depend on how fast an example ran).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ledger.steps import StepStore

SETTING = "onward.clock_offset"
# onward.now() as migration 0007 defines it, with now() replaced by a fixed instant
_FROZEN = """
CREATE OR REPLACE FUNCTION onward.now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT timestamptz '{at}' + coalesce(
        nullif(current_setting('onward.clock_offset', true), '')::interval, interval '0')
$$
"""


def interval(offset: timedelta) -> str:
    return f"{offset.total_seconds():.6f} seconds"


def process_env(offset: timedelta) -> dict[str, str]:
    """Environment for a process whose every ledger connection runs ``offset`` ahead."""
    return {"PGOPTIONS": f"-c {SETTING}={interval(offset).replace(' ', chr(92) + ' ')}"}


def freeze(engine: Engine, at: datetime) -> None:
    """Stop the clock of ``engine``'s database at ``at`` (aware): ``onward.now()`` is ``at``
    plus the connection's offset, whatever the time. Only for a database the test owns (it
    is dropped with it): the function is the database's, every connection to it sees it."""
    with engine.begin() as conn:
        conn.execute(sa.text(_FROZEN.format(at=at.isoformat())))


def set_on_raw(conn: Any, offset: timedelta) -> None:
    """Move one psycopg connection's clock (autocommit or not: set for the session)."""
    conn.execute("SELECT set_config(%s, %s, false)", (SETTING, interval(offset)))


def follow_engine(engine: Engine, offset: list[timedelta]) -> None:
    """Every connection the engine hands out runs ``offset[0]`` ahead (read at checkout)."""

    @sa.event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        with dbapi_conn.cursor() as cursor:
            cursor.execute("SELECT set_config(%s, %s, false)", (SETTING, interval(offset[0])))
        if not dbapi_conn.autocommit:
            # hand the connection out idle, as the pool does: a transaction left open here
            # made setting its isolation level fail (``ledger.db.snapshot``)
            dbapi_conn.commit()


def set_on_store(store: StepStore, offset: timedelta) -> None:
    """Move a worker's hot connection (its claims, commits and step reads) ``offset`` ahead."""
    store.conn.one("SELECT set_config(%(name)s, %(value)s, false)",
                   {"name": SETTING, "value": interval(offset)})
