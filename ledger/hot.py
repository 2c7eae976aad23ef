"""Autocommit psycopg connections for one worker process: each statement is one transaction.

The step hot path (claim, commit), the effect protocol and evidence all run their single
statements here, prepared server-side after first use. Connections come from a bounded
``psycopg_pool`` pool: each statement borrows one for its own duration and gives it back,
so no connection is ever used by two threads (or greenlets) at once, and a process running
``-c 200`` steps that mostly wait on a model holds only as many connections as statements
in flight (at most ``max_size``). With ``max_size=1`` (the default, and a prefork child)
every statement runs on the same connection, as a single dedicated connection would.

Statements are written with psycopg's named placeholders (``%(name)s``). Each SQL text is
turned into PostgreSQL's positional form (``$1``, ``$2``, ...) once per process and run
through a raw cursor: psycopg would otherwise parse every statement longer than 4 KB (the
commit is) again on every call, which cost about a fifth of a worker's CPU per step.

``json`` and ``jsonb`` values are parsed by pydantic's JSON parser (``json.loads`` for one
nested deeper than its 200 levels): the deltas a claim reads with a long chain, or a large
state stored inline, took ``json.loads`` about three times as long.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from typing import Any

import psycopg
import pydantic_core
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool, PoolTimeout

from ledger.db import libpq_conninfo
from ledger.exceptions import LedgerUnavailable, StatementRefused

__all__ = ["CONNECT_TIMEOUT_S", "HotConnection", "positional"]


CONNECT_TIMEOUT_S = 10.0
"""How long a statement waits for a connection (pool exhausted or database unreachable)."""

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%|%")


@functools.lru_cache(maxsize=512)
def positional(sql: str) -> tuple[bytes, tuple[str, ...]]:
    """``sql`` with its ``%(name)s`` placeholders numbered ``$1``, ``$2``, ... in order of
    first appearance (a name used twice is one parameter), ``%%`` read as ``%``; and the
    names in that order. Any other ``%`` is an error, as psycopg would say."""
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            if match.group(0) != "%%":
                raise ValueError(f"a lone % in SQL (write %% for a literal one): {sql[:80]!r}")
            return "%"
        return f"${names.setdefault(name, len(names) + 1)}"

    return _PLACEHOLDER.sub(number, sql).encode(), tuple(names)


def _json_loads(data: str | bytes) -> Any:
    """A ``json``/``jsonb`` value as ``json.loads`` reads it (PostgreSQL sent valid JSON)."""
    try:
        return pydantic_core.from_json(data)
    except ValueError:  # nested past pydantic's 200 levels (a state may nest 500)
        return json.loads(data)


def _configure(conn: psycopg.Connection[Any]) -> None:
    set_json_loads(_json_loads, conn)


class HotConnection:
    """A bounded pool of autocommit connections, opened on first use."""

    def __init__(self, url: str, *, max_size: int = 1,
                 timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        self._url = url
        self.max_size = max_size
        self._timeout_s = timeout_s
        self._pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] | None = None
        self._lock = threading.Lock()

    def _open_pool(self) -> ConnectionPool[psycopg.Connection[dict[str, Any]]]:
        with self._lock:
            if self._pool is None:
                self._pool = ConnectionPool(
                    libpq_conninfo(self._url),
                    kwargs={"autocommit": True, "row_factory": dict_row,
                            "cursor_factory": psycopg.RawCursor},
                    configure=_configure,
                    min_size=0, max_size=self.max_size, timeout=self._timeout_s,
                    reconnect_timeout=self._timeout_s, num_workers=1,
                    name="onward-hot", open=True)
            return self._pool

    def _run(self, sql: str, params: dict[str, Any], many: bool, binary: bool = False) -> Any:
        query, names = positional(sql)
        try:
            values = [params[name] for name in names]
        except KeyError as exc:
            raise StatementRefused(f"statement parameter {exc} missing") from None
        pool = self._pool or self._open_pool()
        try:
            with pool.connection() as conn:
                cursor = conn.execute(query, values, prepare=True, binary=binary)
                return cursor.fetchall() if many else cursor.fetchone()
        except psycopg.OperationalError as exc:
            # The pool drops the broken connection; the statement's outcome is unknown.
            raise LedgerUnavailable(f"ledger database failed: {exc}") from exc
        except PoolTimeout as exc:
            raise LedgerUnavailable(
                f"no ledger connection within {self._timeout_s:.0f}s (database unreachable, "
                f"or all {self.max_size} connections of this process busy): {exc}") from exc
        except psycopg.Error as exc:  # the database refused it: nothing was written
            raise StatementRefused(f"the ledger database refused the statement: {exc}") from exc

    def one(self, sql: str, params: dict[str, Any], *,
            binary: bool = False) -> dict[str, Any] | None:
        """Run one statement (its own transaction) and return its first row (``binary``:
        results in PostgreSQL's binary format, which a large ``bytea`` is sent in as is
        rather than as hex text twice its size, encoded and decoded again).

        A lost connection raises LedgerUnavailable (the statement's outcome is unknown); a
        statement the database refused raises StatementRefused (it wrote nothing)."""
        row: dict[str, Any] | None = self._run(sql, params, many=False, binary=binary)
        return row

    def all(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self._run(sql, params, many=True)
        return rows

    def connections_opened(self) -> int:
        """Connections this pool has opened so far (0 before first use)."""
        pool = self._pool
        return int(pool.get_stats().get("connections_num", 0)) if pool is not None else 0

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(timeout=1.0)
