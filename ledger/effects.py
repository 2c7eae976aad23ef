"""Effects: the intent of an external write, recorded before the call (docs/design.md section 5).

Every operation is one statement on the worker's hot connection, so the ``pending`` row is
committed before the provider is called, and each attempt's outcome is committed as soon
as it is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from psycopg.types.json import Jsonb
from sqlalchemy.engine import Connection

from ledger.exceptions import OnwardError
from ledger.hot import HotConnection
from ledger.schema import EffectAttemptKind, EffectStatus
from ledger.schema import effect_attempts as effect_attempts_table
from ledger.schema import effects as effects_table


class EffectFenced(OnwardError):
    """The step's lease was taken over: this holder may not record new effects."""


class EffectConflict(OnwardError):
    """The same effect key was first requested with a different payload."""


@dataclass(frozen=True)
class Effect:
    """One row of ``onward.effects``."""

    effect_id: str
    effect_type: str
    run_id: UUID
    seq: int
    step: str
    command_id: str
    tool_class: str
    request_hash: str
    recipient: str | None
    payload: dict[str, Any] | None
    status: EffectStatus
    provider_ref: str | None
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    reconciled: bool
    attempts: int
    polls: int
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Effect:
        fields = {name: row[name] for name in cls.__dataclass_fields__}
        fields["status"] = EffectStatus(row["status"])
        return cls(**fields)


@dataclass(frozen=True)
class Intent:
    effect_id: str
    effect_type: str
    run_id: UUID
    tenant_id: str
    seq: int
    step: str
    command_id: str
    tool_class: str
    request_hash: str
    recipient: str | None
    payload: dict[str, Any] | None
    lease_epoch: int | None = None  # the claim's epoch; None only for operator commands


_INTEND = """
WITH lease AS (
    -- fenced: only the holder of the step's lease may record a new intent
    SELECT EXISTS (SELECT 1 FROM onward.runs
                    WHERE id = %(run_id)s AND status = 'running'
                      AND (%(epoch)s::bigint IS NULL OR lease_epoch = %(epoch)s)) AS held
), ins AS (
    INSERT INTO onward.effects (effect_id, effect_type, run_id, tenant_id, seq, step,
                                command_id, tool_class, request_hash, recipient, payload,
                                status)
    SELECT %(effect_id)s, %(effect_type)s, %(run_id)s, %(tenant_id)s, %(seq)s, %(step)s,
           %(command_id)s, %(tool_class)s, %(request_hash)s, %(recipient)s, %(payload)s,
           'pending'
     WHERE (SELECT held FROM lease)
    ON CONFLICT (effect_type, effect_id) DO NOTHING
    RETURNING *, true AS created
), found AS (
    SELECT * FROM ins
    UNION ALL
    SELECT e.*, false AS created FROM onward.effects e
     WHERE e.effect_type = %(effect_type)s AND e.effect_id = %(effect_id)s
       AND NOT EXISTS (SELECT 1 FROM ins)
)
SELECT lease.held, found.* FROM lease LEFT JOIN found ON true
"""

_BEGIN_ATTEMPT = """
WITH bumped AS (
    -- fenced right before each provider call: the effect is still unresolved and the caller
    -- still holds a live lease of the step (epoch NULL: an operator's audited command)
    UPDATE onward.effects e SET attempts = e.attempts + 1, updated_at = onward.now()
      FROM onward.runs r
     WHERE e.effect_type = %(effect_type)s AND e.effect_id = %(effect_id)s
       AND e.status IN ('pending', 'accepted') AND r.id = e.run_id
       AND (%(epoch)s::bigint IS NULL
            OR (r.lease_epoch = %(epoch)s AND r.status = 'running'
                AND r.lease_expires_at > onward.now()))
 RETURNING e.attempts
)
INSERT INTO onward.effect_attempts (effect_type, effect_id, attempt, kind, worker, lease_epoch,
                                    idempotency_key)
SELECT %(effect_type)s, %(effect_id)s, attempts, %(kind)s, %(worker)s, %(epoch)s, %(key)s
  FROM bumped
RETURNING attempt
"""

_RECORD = """
WITH attempt AS (
    UPDATE onward.effect_attempts
       SET ended_at = onward.now(), outcome = %(outcome)s, provider_ref = %(provider_ref)s,
           error = %(error)s
     WHERE effect_type = %(effect_type)s AND effect_id = %(effect_id)s AND attempt = %(attempt)s
), effect AS (
    UPDATE onward.effects
       SET status = %(status)s,
           provider_ref = coalesce(%(provider_ref)s, provider_ref),
           result = coalesce(%(result)s, result),
           error = %(error)s,
           reconciled = reconciled OR %(reconciled)s,
           polls = polls + %(poll)s,
           updated_at = onward.now(),
           completed_at = CASE WHEN %(status)s IN ('completed', 'failed') THEN onward.now() END
     WHERE effect_type = %(effect_type)s AND effect_id = %(effect_id)s
       AND status IN ('pending', 'accepted')
 RETURNING *
)
SELECT * FROM effect
UNION ALL
SELECT e.* FROM onward.effects e
 WHERE e.effect_type = %(effect_type)s AND e.effect_id = %(effect_id)s
   AND NOT EXISTS (SELECT 1 FROM effect)
"""

_PENDING_AT = """
SELECT e.*, (SELECT a.outcome FROM onward.effect_attempts a
              WHERE a.effect_type = e.effect_type AND a.effect_id = e.effect_id
              ORDER BY a.attempt DESC LIMIT 1) AS last_outcome
  FROM onward.effects e
 WHERE e.run_id = %(run_id)s AND e.seq = %(seq)s AND e.status IN ('pending', 'accepted')
"""

_FAIL_PENDING_AT = """
UPDATE onward.effects SET status = 'failed', completed_at = onward.now(), updated_at = onward.now(),
       error = coalesce(error, '{}'::jsonb) || jsonb_build_object('closed_by', 'run failed')
 WHERE run_id = %(run_id)s AND seq = %(seq)s AND status = 'pending'
RETURNING effect_id
"""


class EffectStore:
    """Effect rows and their attempts, on the worker's hot connection."""

    def __init__(self, conn: HotConnection) -> None:
        self.conn = conn

    def intend(self, intent: Intent) -> tuple[Effect, bool]:
        """Insert the effect as ``pending`` (committed) or read the existing one.

        Returns ``(effect, created)``.
        """
        params = {
            "effect_id": intent.effect_id,
            "effect_type": intent.effect_type,
            "run_id": intent.run_id,
            "tenant_id": intent.tenant_id,
            "seq": intent.seq,
            "step": intent.step,
            "command_id": intent.command_id,
            "tool_class": intent.tool_class,
            "request_hash": intent.request_hash,
            "recipient": intent.recipient,
            "payload": Jsonb(intent.payload) if intent.payload is not None else None,
            "epoch": intent.lease_epoch,
        }
        for _ in range(3):  # a concurrent insert can hide from this statement's snapshot
            row = self.conn.one(_INTEND, params)
            if row is not None and row["effect_id"] is not None:
                if not row["held"] and row["created"]:
                    raise OnwardError("unreachable: an intent was inserted without the lease")
                if not row["held"] and row["status"] == EffectStatus.PENDING.value:
                    raise EffectFenced(f"run {intent.run_id}: the lease of epoch "
                                       f"{intent.lease_epoch} was taken over; not calling "
                                       f"{intent.effect_type} again from a stale holder")
                return Effect.from_row(row), bool(row["created"])
            if row is not None and not row["held"]:
                raise EffectFenced(f"run {intent.run_id}: the lease of epoch "
                                   f"{intent.lease_epoch} was taken over; {intent.effect_type} "
                                   "not requested")
        raise OnwardError(f"effect {intent.effect_id} could be neither inserted nor read")

    def begin_attempt(self, effect: Effect, kind: EffectAttemptKind, *, worker: str,
                      epoch: int | None) -> int:
        row = self.conn.one(_BEGIN_ATTEMPT, {
            "effect_type": effect.effect_type, "effect_id": effect.effect_id,
            "kind": kind.value, "worker": worker, "epoch": epoch, "key": effect.effect_id,
        })
        if row is None:
            raise EffectFenced(
                f"effect {effect.effect_id[:16]}… ({effect.effect_type}): not calling — the "
                f"lease of epoch {epoch} is no longer held or the effect was resolved meanwhile")
        return int(row["attempt"])

    def record(
        self,
        effect: Effect,
        attempt: int,
        *,
        outcome: str,
        status: EffectStatus,
        provider_ref: str | None = None,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        reconciled: bool = False,
        poll: bool = False,
    ) -> Effect:
        """Record one attempt's outcome and the effect's new status, in one transaction.

        A completed or failed effect is never overwritten; its row is returned as it is.
        """
        row = self.conn.one(_RECORD, {
            "effect_type": effect.effect_type, "effect_id": effect.effect_id,
            "attempt": attempt, "outcome": outcome, "status": status.value,
            "provider_ref": provider_ref,
            "result": Jsonb(result) if result is not None else None,
            "error": Jsonb(error) if error is not None else None,
            "reconciled": reconciled, "poll": 1 if poll else 0,
        })
        if row is None:
            raise OnwardError(f"effect {effect.effect_id} vanished")
        return Effect.from_row(row)

    def unresolved_at(self, run_id: UUID, seq: int) -> list[tuple[Effect, str | None]]:
        """Pending or accepted effects of one step, with their last attempt's outcome."""
        rows = self.conn.all(_PENDING_AT, {"run_id": run_id, "seq": seq})
        return [(Effect.from_row(r), r["last_outcome"]) for r in rows]

    def approval(self, approval_id: str) -> dict[str, Any] | None:
        """The approval a resumed step reads its decision from (status, who, comment)."""
        return self.conn.one(
            "SELECT id, run_id, seq, action, status, decided_by, decided_at, comment, "
            "artifact_hash, artifact, expires_at, decision_mac, "
            "onward.now() < expires_at AS unexpired "
            "FROM onward.approvals WHERE id = %(id)s", {"id": approval_id})

    def signal_payload(self, run_id: UUID, name: str, seq: int) -> Any:
        row = self.conn.one(
            "SELECT payload FROM onward.signals WHERE run_id = %(run_id)s AND name = %(name)s "
            "AND consumed_seq = %(seq)s", {"run_id": run_id, "name": name, "seq": seq})
        return row["payload"] if row else None

    def close_pending_at(self, run_id: UUID, seq: int) -> int:
        """Mark the step's pending effects failed when its run fails for good."""
        return len(self.conn.all(_FAIL_PENDING_AT, {"run_id": run_id, "seq": seq}))


@dataclass(frozen=True)
class EffectAttempt:
    attempt: int
    kind: str
    worker: str
    idempotency_key: str
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None
    provider_ref: str | None
    error: dict[str, Any] | None


def list_effects_txn(conn: Connection, run_id: UUID) -> list[Effect]:
    rows = conn.execute(
        sa.select(effects_table).where(effects_table.c.run_id == run_id)
        .order_by(effects_table.c.seq, effects_table.c.created_at)
    ).mappings()
    return [Effect.from_row(dict(r)) for r in rows]


def list_attempts_txn(conn: Connection, effect: Effect) -> list[EffectAttempt]:
    rows = conn.execute(
        sa.select(effect_attempts_table)
        .where(effect_attempts_table.c.effect_type == effect.effect_type)
        .where(effect_attempts_table.c.effect_id == effect.effect_id)
        .order_by(effect_attempts_table.c.attempt)
    ).mappings()
    return [EffectAttempt(**{f: r[f] for f in EffectAttempt.__dataclass_fields__}) for r in rows]
