"""One autocommit psycopg connection per worker process: each statement is one transaction.

The step hot path (claim, commit), the effect protocol and evidence all run their single
statements here, prepared server-side after first use.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from ledger.db import connect_raw
from ledger.exceptions import LedgerUnavailable


class HotConnection:
    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.Connection[dict[str, Any]] | None = None

    def _connection(self) -> psycopg.Connection[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            conn = connect_raw(self._url, autocommit=True)
            conn.row_factory = dict_row
            self._conn = conn
        assert self._conn is not None
        return self._conn

    def one(self, sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
        """Run one statement (its own transaction) and return its first row."""
        try:
            return self._connection().execute(sql, params, prepare=True).fetchone()
        except psycopg.OperationalError as exc:
            self.close()  # reconnect on next use; the statement's outcome is unknown
            raise LedgerUnavailable(f"ledger database failed: {exc}") from exc

    def all(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            return self._connection().execute(sql, params, prepare=True).fetchall()
        except psycopg.OperationalError as exc:
            self.close()
            raise LedgerUnavailable(f"ledger database failed: {exc}") from exc

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
