"""The outbox as the dispatcher sees it: due rows, taken with FOR UPDATE SKIP LOCKED.

Rows a worker publishes itself after commit (``worker_publishes``) are left alone for a
grace period; the claim of the step deletes its row, so only rows whose message was lost
or never sent are still there afterwards. Every other row (new runs, retries, timers,
reaper re-sends) is published as soon as it is due; a trigger NOTIFYs the dispatcher.

A published row nobody claimed is published again ``republish_s`` after its last publish,
doubling each time up to ``republish_max_s``: a lost message is re-sent within
``republish_max_s``. A row whose run is no longer ``running`` (or has moved past the row's
seq) is deleted, never published: a trigger deletes those rows when the run stops
(migration 0009), this is the safety net.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from ledger import sql
from ledger.db import connect_raw
from ledger.exceptions import LedgerUnavailable

__all__ = ["CHANNEL", "OutboxMessage", "OutboxStore"]


CHANNEL = "onward_outbox"

_DUE = sql.statement("due_messages")
_LIVE_QUEUES = sql.statement("live_queues")
_DROP = sql.statement("drop_messages")
_MARK = sql.statement("mark_published")
_NEXT_DUE = sql.statement("next_due")


@dataclass(frozen=True)
class OutboxMessage:
    id: int
    run_id: UUID
    seq: int
    workflow: str = ""
    workflow_version: int | None = None
    step: str | None = None  # the step the message runs; None: the workflow's start step
    attempt: int = 1  # the attempt the message starts (for display)
    trace_context: str | None = None  # the traceparent the step's span continues
    priority: str = "normal"  # the run's priority: the message's broker priority


class OutboxStore:
    """Outbox sweeps for one dispatcher process, on its own connection."""

    def __init__(self, url: str, *, grace_s: float, republish_s: float,
                 republish_max_s: float) -> None:
        self._url = url
        self._grace = grace_s
        self._republish = republish_s
        self._republish_max = max(republish_s, republish_max_s)
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self._listener: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            conn = connect_raw(self._url, autocommit=False)
            conn.row_factory = dict_row
            self._conn = conn
        assert self._conn is not None
        return self._conn

    def sweep(
        self,
        publish: Callable[[OutboxMessage], None],
        *,
        limit: int = 500,
        after_publish: Callable[[], None] | None = None,
    ) -> int:
        """Publish every due row once, then mark it, in one transaction; return the count.
        Rows of runs that stopped are deleted in the same transaction, unpublished.

        A crash after publishing and before the mark commits leaves the rows unmarked: they
        are published again, and the duplicate delivery is a no-op at the claim.
        """
        conn = self._connection()
        try:
            with conn.transaction():
                rows = conn.execute(
                    _DUE, {"grace": self._grace, "republish": self._republish,
                           "republish_max": self._republish_max, "limit": limit}
                ).fetchall()
                dead = [r["id"] for r in rows if r["dead"]]
                if dead:
                    conn.execute(_DROP, {"ids": dead})
                messages = [OutboxMessage(r["id"], r["run_id"], r["seq"], r["workflow"],
                                          r["workflow_version"], r["step"], r["attempt"] + 1,
                                          r["trace_context"], r["priority"])
                            for r in rows if not r["dead"]]
                for message in messages:
                    publish(message)
                if messages and after_publish is not None:
                    after_publish()
                if messages:
                    conn.execute(_MARK, {"ids": [m.id for m in messages]})
            return len(messages)
        except psycopg.OperationalError as exc:
            self.close()
            raise LedgerUnavailable(f"outbox sweep failed: {exc}") from exc

    def live_queues(self, within_s: float) -> set[str]:
        """Version queues some worker advertised within ``within_s`` seconds."""
        return set(self.live_queue_starts(within_s))

    def live_queue_starts(self, within_s: float) -> dict[str, tuple[str, str | None]]:
        """Queues some worker advertised within ``within_s`` seconds, each with its
        workflow and the start step of the code behind it (None from older workers)."""
        conn = self._connection()
        with conn.transaction():
            rows = conn.execute(_LIVE_QUEUES, {"within": within_s}).fetchall()
        return {r["queue"]: (r["workflow"], r["start_step"]) for r in rows}

    def seconds_to_next_due(self) -> float | None:
        conn = self._connection()
        with conn.transaction():
            row = conn.execute(_NEXT_DUE).fetchone()
        if row is None or row["next_due_in"] is None:
            return None
        return max(0.0, float(row["next_due_in"]))  # the database's clock, not this host's

    def wait(self, timeout_s: float) -> int:
        """Block until a NOTIFY on the outbox channel or the timeout; return notifications."""
        if self._listener is None or self._listener.closed:
            self._listener = connect_raw(self._url, autocommit=True)
            self._listener.execute(f"LISTEN {CHANNEL}")
        count = 0
        try:
            for _ in self._listener.notifies(timeout=timeout_s, stop_after=1):
                count += 1
        except psycopg.OperationalError as exc:
            self._listener.close()
            raise LedgerUnavailable(f"LISTEN connection failed: {exc}") from exc
        return count

    def close(self) -> None:
        for conn in (self._conn, self._listener):
            if conn is not None and not conn.closed:
                conn.close()
        self._conn = None
        self._listener = None
