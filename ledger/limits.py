"""Fleet-wide limits and per-call retry counts (docs/limits.md), on the worker's autocommit
connection: one statement each, and none at all for a call whose tool declares no limit
and does not fail.

PostgreSQL holds the slots, not Redis: the ledger is already the source of truth every
worker shares, a grant is fenced by the same lease epoch as the call it admits, a slot
whose holder died expires with the time its lease covered the call, and a broker flush
(docs/guarantees.md) cannot lose or double a slot. ``onward.limit_acquire`` and
``onward.limit_release`` (migration 0032) are PL/pgSQL functions, so each is one round
trip that locks the limit's row for its own transaction only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb
from sqlalchemy.engine import Connection

from ledger import sql
from ledger.crypto import Keyring, Place, sealed_text
from ledger.exceptions import StatementRefused
from ledger.hot import HotConnection

__all__ = ["Grant", "LimitState", "LimitStore", "RetryStore", "call_error_field",
           "limit_states_txn"]

_COUNT_FAILURE = sql.statement("count_call_failure")
_FAILURES = sql.statement("call_failures")
_ACQUIRE = sql.statement("acquire_limit")
_RELEASE = sql.statement("release_limit")


def call_error_field(command_id: str) -> str:
    """The field a sealed message of a call's counted failure is bound to."""
    return f"call:{command_id}:error.message"


class RetryStore:
    """How often one call failed in a way its retry policy retries (``call_retries``)."""

    def __init__(self, conn: HotConnection, crypt: Keyring | None = None) -> None:
        self.conn = conn
        self.crypt = crypt

    def failures(self, run_id: UUID, seq: int, command_id: str) -> int:
        row = self.conn.one(_FAILURES, {"run_id": run_id, "seq": seq, "command_id": command_id})
        return int(row["failures"]) if row is not None else 0

    def count_failure(self, run_id: UUID, seq: int, command_id: str, *, epoch: int,
                      error: dict[str, Any], tenant_id: str = "") -> int | None:
        """Count one more failure of the call; the total, or None once the lease is lost.
        With encryption keys, the error's message (the provider's text) is kept sealed."""
        if isinstance(error.get("message"), str):
            error = {**error, "message": sealed_text(self.crypt, error["message"], Place(
                tenant_id, run_id, seq, call_error_field(command_id)))}
        row = self.conn.one(_COUNT_FAILURE, {"run_id": run_id, "seq": seq,
                                             "command_id": command_id, "epoch": epoch,
                                             "error": Jsonb(error)})
        return int(row["failures"]) if row is not None else None


@dataclass(frozen=True)
class Grant:
    """What ``LimitStore.acquire`` answered: a slot, or how long to wait for one."""

    granted: bool
    retry_in_s: float
    in_use: int
    waiting: int


class LimitStore:
    """Take and give back slots of fleet-wide limits (concurrency and rate)."""

    def __init__(self, conn: HotConnection, *, grace_s: float = 30.0) -> None:
        self.conn = conn
        self.grace_s = grace_s

    def acquire(self, key: str, name: str, *, concurrency: int | None,
                rate: tuple[int, float] | None, run_id: UUID, seq: int, command_id: str,
                epoch: int, rank: int, hold_s: float, wait_s: float) -> Grant:
        """A slot for the call ``command_id`` of ``run_id`` held for at most ``hold_s`` (its
        time limit and lease margin), or the run's place in the limit's queue and when to
        ask again (``wait_s`` at most; sooner when the rate is what binds)."""
        row = self.conn.one(_ACQUIRE, {
            "key": key, "name": name, "concurrency": concurrency,
            "rate_count": rate[0] if rate else None, "rate_window_s": rate[1] if rate else None,
            "run_id": run_id, "seq": seq, "command_id": command_id, "epoch": epoch,
            "rank": rank, "hold_s": hold_s, "wait_s": wait_s, "grace_s": self.grace_s})
        if row is None:  # the function returns one row, always
            raise StatementRefused(f"onward.limit_acquire returned nothing for {key}")
        return Grant(bool(row["granted"]), float(row["retry_in_s"]), int(row["in_use"]),
                     int(row["waiting"]))

    def release(self, key: str, *, run_id: UUID, command_id: str, epoch: int) -> int:
        """Give the slot back and wake the waiters it frees; how many were woken."""
        row = self.conn.one(_RELEASE, {"key": key, "run_id": run_id, "command_id": command_id,
                                       "epoch": epoch, "grace_s": self.grace_s})
        return int(row["woken"]) if row is not None else 0


@dataclass(frozen=True)
class LimitState:
    """One limit key as ``onward limits`` and the metrics show it."""

    key: str
    name: str
    concurrency: int | None
    rate_count: int | None
    rate_window_s: float | None
    in_use: int
    started_in_window: int
    waiting: int
    granted: int
    throttled: int
    declared_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> LimitState:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})

    def as_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["declared_at"] = self.declared_at.isoformat()
        return data


_STATES = sql.text("limit_states")


def limit_states_txn(conn: Connection) -> list[LimitState]:
    """Every limit key with its declared values and current use."""
    return [LimitState.from_row(row) for row in conn.execute(_STATES).mappings()]
