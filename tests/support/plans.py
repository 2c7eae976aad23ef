"""Query plans of the ledger's own statements, read as a worker sends them: a step store
whose statements containing a marker are also EXPLAINed (never executed twice), with the
parameters they were sent with; and the statements an engine sends meanwhile."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy as sa

from ledger.db import libpq_conninfo
from ledger.hot import positional
from ledger.steps import StepStore

__all__ = ["explain", "explaining", "sent_by"]


def explain(url: str, query: str, params: dict[str, Any], *,
            setup: tuple[str, ...] = ()) -> list[str]:
    """The lines of ``EXPLAIN (COSTS OFF)`` for ``query`` bound to ``params`` (nothing is
    executed), after the session statements ``setup`` (e.g. ``SET enable_seqscan = off``)."""
    text, names = positional(query)
    with psycopg.connect(libpq_conninfo(url), cursor_factory=psycopg.RawCursor) as conn:
        for statement in setup:
            conn.execute(statement)
        return [row[0] for row in conn.execute(b"EXPLAIN (COSTS OFF) " + text,
                                               [params[name] for name in names])]


def explaining(store: StepStore, marker: str,
               seen: Callable[[str, dict[str, Any]], None]) -> None:
    """From now on, ``store`` hands every statement containing ``marker`` to ``seen``
    (query and parameters) before running it as usual."""
    run_statement = store._one

    def spied(query: str, params: dict[str, Any], *, binary: bool = False) -> Any:
        if marker in query:
            seen(query, params)
        return run_statement(query, params, binary=binary)

    store._one = spied  # type: ignore[method-assign,assignment]


@contextmanager
def sent_by(engine: sa.engine.Engine) -> Iterator[list[str]]:
    """The statements ``engine`` sends meanwhile, as sent (a list filled as they go)."""
    sent: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *rest: object) -> None:
        sent.append(statement)

    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
