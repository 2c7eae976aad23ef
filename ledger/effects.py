"""Effects: the intent of an external write, recorded before the call (docs/design.md section 5).

Every operation is one statement on the worker's hot connection, so the ``pending`` row is
committed before the provider is called, and each attempt's outcome is committed as soon
as it is known. The statements are in ``ledger/sql/effects.sql``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from psycopg.types.json import Jsonb
from sqlalchemy.engine import Connection

from ledger import compacted, signed, sql
from ledger.attempt_history import checked_rows_problems
from ledger.checkpoints import CheckpointKeys, canonical_json, sha256_hex
from ledger.crypto import MASK, Keyring, Place, is_sealed, open_value, seal_value, sealed_text
from ledger.exceptions import (
    CancelRequested,
    EffectFenced,
    IntegrityViolation,
    OnwardError,
)
from ledger.hot import HotConnection
from ledger.schema import effect_attempts as effect_attempts_table
from ledger.schema import effects as effects_table
from ledger.vocabulary import EffectAttemptKind, EffectAttemptOutcome, EffectStatus

__all__ = [
    "ANSWER_AFTER_LEASE",
    "CALL_OVERRAN",
    "ERROR_TEXT",
    "NEVER_LANDED",
    "OUTCOME_UNKNOWN",
    "UNKNOWN_CALL",
    "Effect",
    "EffectAttempt",
    "EffectStore",
    "Intent",
    "check_effect",
    "check_recipient",
    "effect_error",
    "effect_field",
    "list_attempts_txn",
    "list_effects_txn",
    "overran_call",
    "seal_effect_error",
    "seal_effect_result",
    "unknown_call",
]


CALL_OVERRAN = "CallOverran"
"""The error type a call's worker marks a call with while it is in flight past its time limit."""
ANSWER_AFTER_LEASE = "AnswerAfterLease"
"""The error type of a call's answer that came after its lease was lost."""


def unknown_call(e: str) -> str:
    """Whether a call of effect ``e`` may have reached the provider, as SQL (the fragment
    ``unknown_call`` of ledger/sql/effects.sql, which says when)."""
    return sql.fragment("unknown_call", e)


def overran_call(e: str) -> str:
    """Whether a call of effect ``e`` is still in flight past its time limit, as SQL (the
    fragment ``overran_call`` of ledger/sql/effects.sql)."""
    return sql.fragment("overran_call", e)


UNKNOWN_CALL = unknown_call("e")
OUTCOME_UNKNOWN = sql.fragment("outcome_unknown")
NEVER_LANDED = sql.fragment("never_landed")


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
    polling_since: datetime | None = None  # the status-polling window's start (else created)
    call_unknown: bool | None = None  # ``UNKNOWN_CALL``, where it was read (else None)
    call_overran: bool | None = None  # ``overran_call``, where it was read (else None)
    intent_mac: str | None = None  # ledger/signed.py effect_intent
    outcome_mac: str | None = None  # ledger/signed.py effect_outcome (completed or failed)
    recipient_mac: str | None = None  # ledger/signed.py effect_recipient (with a recipient)
    tenant_id: str | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Effect:
        fields: dict[str, Any] = {name: row.get(name) for name in cls.__dataclass_fields__}
        fields["status"] = EffectStatus(row["status"])
        return cls(**fields)

    @property
    def outcome_unknown(self) -> bool:
        """Whether the provider may have acted (see ``OUTCOME_UNKNOWN``)."""
        if self.status is EffectStatus.ACCEPTED:
            return True
        return self.status is EffectStatus.PENDING and bool(self.call_unknown)


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


_INTEND = sql.statement("record_intent")

_BEGIN_ATTEMPT = sql.statement("begin_effect_attempt")

_RECORD = sql.statement("record_effect_outcome")

_MARK_OVERRAN = sql.statement("mark_call_overran")

_RECORD_LATE = sql.statement("record_late_answer")

_UNRESOLVED = sql.statement("unresolved_effects")

_CLOSE_UNSENT = sql.statement("close_unsent_effects")

_ATTEMPTS_CHECKED = sql.statement("effect_attempts_checked")


def check_recipient(keys: CheckpointKeys, effect: Effect) -> None:
    """Raise IntegrityViolation unless the effect's recipient, when it has one, matches its
    MAC (none to check once retention or a bundle dropped it)."""
    if effect.recipient is not None:
        keys.check(signed.effect_recipient(effect.effect_type, effect.effect_id,
                                           effect.recipient), effect.recipient_mac,
                   f"effect {effect.effect_type} {effect.effect_id[:16]}…'s recipient")


def check_effect(keys: CheckpointKeys, effect: Effect) -> None:
    """Raise IntegrityViolation unless the effect's intent, and its outcome once it is
    completed or failed, match their MACs (a result retention compacted: its seal,
    ledger/compacted.py)."""
    what = f"effect {effect.effect_type} {effect.effect_id[:16]}…"
    keys.check(signed.effect_intent(vars(effect)), effect.intent_mac, f"{what}'s request")
    if effect.status in (EffectStatus.COMPLETED, EffectStatus.FAILED) and \
            compacted.digest_of(effect.result) is not None and \
            compacted.is_sealed(keys, "effect_result", compacted.effect_identity(effect),
                                effect.result):
        return  # retention dropped the result, sealed when the outcome verified
    if effect.status in (EffectStatus.COMPLETED, EffectStatus.FAILED):
        keys.check(signed.effect_outcome(effect.effect_type, effect.effect_id,
                                         effect.status.value, effect.provider_ref,
                                         effect.result),
                   effect.outcome_mac, f"{what}'s outcome ({effect.status.value})")


def effect_field(effect_type: str, effect_id: str, what: str) -> str:
    """The field a sealed payload or result of an effect is bound to (ledger/crypto.py)."""
    return f"effect:{effect_type}:{effect_id}:{what}"


def seal_effect_result(crypt: Keyring | None, effect: Effect, result: Any) -> Any:
    """``result`` as the effect's row stores it: sealed for the effect's result field when
    keys are configured (also what a repeat or a person's resolution records: the
    provider's answer may quote the payload), else as it is."""
    return seal_value(crypt, result, Place(
        effect.tenant_id or "", effect.run_id, effect.seq,
        effect_field(effect.effect_type, effect.effect_id, "result")))


ERROR_TEXT = ("message", "provider")
"""What of an effect's (or an attempt's) error is the provider's text, sealed with keys:
an exception's message, a provider's failure answer. Its type and status code stay plain."""


def _error_field(effect: Effect, attempt: int | None, key: str) -> str:
    """The field a sealed part of the effect's error (``attempt`` None) or of one attempt's
    error is bound to."""
    where = "error" if attempt is None else f"attempt:{attempt}:error"
    return effect_field(effect.effect_type, effect.effect_id, f"{where}.{key}")


def seal_effect_error(crypt: Keyring | None, effect: Effect, error: dict[str, Any] | None,
                      attempt: int | None = None) -> dict[str, Any] | None:
    """``error`` with its provider text (``ERROR_TEXT``) sealed for the effect's error, or
    for ``attempt``'s, when keys are configured (as the payload it may quote is). A tenant
    whose keys were erased (nothing more can be sealed for it) gets ``***``."""
    if crypt is None or not error:
        return error
    sealed = dict(error)
    for key in ERROR_TEXT:
        if sealed.get(key) is not None:
            sealed[key] = sealed_text(crypt, sealed[key], Place(
                effect.tenant_id or "", effect.run_id, effect.seq,
                _error_field(effect, attempt, key)))
    return sealed


def effect_error(error: dict[str, Any] | None, effect: Effect, attempt: int | None,
                 show: Callable[[Any, str], Any]) -> dict[str, Any] | None:
    """``error`` with each sealed part replaced by ``show(value, field)`` (opened, or
    masked for a reader who may not see it); a plain error as it is."""
    if not error or not any(is_sealed(error.get(key)) for key in ERROR_TEXT):
        return error
    return {key: show(value, _error_field(effect, attempt, key)) if is_sealed(value) else value
            for key, value in error.items()}


def opened_effect(keys: CheckpointKeys, effect: Effect) -> Effect:
    """The effect with its sealed payload, result and error opened (and the payload checked
    against its signed request hash); raises SealedValueUnreadable."""
    tenant = effect.tenant_id or ""
    error = effect_error(effect.error, effect, None, lambda value, field: open_value(
        keys.crypt, value, tenant=tenant, run_id=effect.run_id, seq=effect.seq, field=field))
    if error is not effect.error:
        effect = replace(effect, error=error)
    if effect.payload is None and effect.result is None:
        return effect
    payload = open_value(keys.crypt, effect.payload, tenant=tenant, run_id=effect.run_id,
                         seq=effect.seq, field=effect_field(effect.effect_type,
                                                            effect.effect_id, "payload"))
    result = open_value(keys.crypt, effect.result, tenant=tenant, run_id=effect.run_id,
                        seq=effect.seq, field=effect_field(effect.effect_type,
                                                           effect.effect_id, "result"))
    if payload is effect.payload and result is effect.result:
        return effect
    if payload is not effect.payload and \
            sha256_hex(canonical_json(payload)) != effect.request_hash:
        raise IntegrityViolation(f"effect {effect.effect_type} {effect.effect_id[:16]}…: its "
                                 "sealed payload is not what its signed request hash names")
    return replace(effect, payload=payload, result=result)


class EffectStore:
    """Effect rows and their attempts, on the worker's hot connection. With encryption keys
    configured, payloads and results are sealed as they are written and opened as they are
    read (ledger/crypto.py)."""

    def __init__(self, conn: HotConnection, keys: CheckpointKeys) -> None:
        self.conn = conn
        self.keys = keys
        self._began: dict[tuple[str, str, int], EffectAttemptKind] = {}

    def check(self, effect: Effect) -> Effect:
        """The effect, once its intent and (completed or failed) its outcome verify against
        their MACs; raises IntegrityViolation for an effect edited outside onward, so a step
        or a replay is never answered with an edited result."""
        check_effect(self.keys, effect)
        return opened_effect(self.keys, effect)

    def check_attempts(self, effect: Effect) -> None:
        """Raise IntegrityViolation unless the effect's attempts are as onward recorded them
        (ledger/attempt_history.py): asked before a retried step acts on an unfinished
        effect, whose attempts decide between a lookup and a resend (one statement, off
        the hot path: only an effect an earlier attempt of the step left unfinished)."""
        rows = self.conn.all(_ATTEMPTS_CHECKED, {"effect_type": effect.effect_type,
                                                 "effect_id": effect.effect_id})
        for problem in checked_rows_problems(self.keys, effect.effect_type, effect.effect_id,
                                             rows):
            raise IntegrityViolation(problem)

    def intend(self, intent: Intent) -> tuple[Effect, bool]:
        """Insert the effect as ``pending`` (committed) or read the existing one.

        Returns ``(effect, created)``.
        """
        payload = seal_value(self.keys.crypt, intent.payload, Place(
            intent.tenant_id, intent.run_id, intent.seq,
            effect_field(intent.effect_type, intent.effect_id, "payload")))
        recipient = (intent.recipient if self.keys.crypt is None or intent.recipient is None
                     else MASK)
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
            # derived from the payload for display: not kept in the clear beside a sealed one
            "recipient": recipient,
            "recipient_mac": (None if recipient is None else self.keys.sign(
                signed.effect_recipient(intent.effect_type, intent.effect_id, recipient))),
            "payload": Jsonb(payload) if payload is not None else None,
            "epoch": intent.lease_epoch,
            "intent_mac": self.keys.sign(signed.effect_intent(vars(intent))),
        }
        for _ in range(3):  # a concurrent insert can hide from this statement's snapshot
            row = self.conn.one(_INTEND, params)
            if row is not None and row["effect_id"] is not None:
                if not row["held"] and row["created"]:
                    raise OnwardError("unreachable: an intent was inserted without the lease")
                effect = self.check(Effect.from_row(row))
                if not row["held"] and effect.status not in (EffectStatus.COMPLETED,
                                                             EffectStatus.FAILED):
                    raise self._not_held(intent, bool(row["cancelling"]))
                return effect, bool(row["created"])
            if row is not None and not row["held"]:
                raise self._not_held(intent, bool(row["cancelling"]))
        raise OnwardError(f"effect {intent.effect_id} could be neither inserted nor read")

    @staticmethod
    def _not_held(intent: Intent, cancelling: bool) -> OnwardError:
        if cancelling:
            return CancelRequested(f"run {intent.run_id} is being cancelled: "
                                   f"{intent.effect_type} is not requested")
        return EffectFenced(f"run {intent.run_id}: the lease of epoch {intent.lease_epoch} "
                            f"is no longer held; {intent.effect_type} not requested")

    def begin_attempt(self, effect: Effect, kind: EffectAttemptKind, *, worker: str,
                      epoch: int, cover_s: float) -> int:
        """Record an attempt before calling the provider, fenced on the caller's live lease,
        and extend that lease to ``now + cover_s`` (the call's timeout and a margin) in the
        same statement, so the call cannot outlive it."""
        row = self.conn.one(_BEGIN_ATTEMPT, {
            "run_id": effect.run_id, "effect_type": effect.effect_type,
            "effect_id": effect.effect_id, "kind": kind.value, "worker": worker,
            "epoch": epoch, "key": effect.effect_id, "cover_s": cover_s,
        })
        if row is None or row["attempt"] is None:
            if row is not None and row["cancelling"] and kind is EffectAttemptKind.CALL:
                raise CancelRequested(
                    f"run {effect.run_id} is being cancelled: {effect.effect_type} "
                    f"({effect.command_id}) is not sent")
            raise EffectFenced(
                f"effect {effect.effect_id[:16]}… ({effect.effect_type}): not calling — the "
                f"lease of epoch {epoch} is no longer live or the effect was resolved meanwhile")
        attempt = int(row["attempt"])
        self._began[(effect.effect_type, effect.effect_id, attempt)] = kind  # signed at its end
        return attempt

    def record(
        self,
        effect: Effect,
        attempt: int,
        *,
        outcome: EffectAttemptOutcome,
        status: EffectStatus,
        provider_ref: str | None = None,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        reconciled: bool = False,
        poll: bool = False,
        epoch: int,
    ) -> Effect:
        """Record one attempt's outcome and the effect's new status, in one transaction,
        fenced on the live lease of ``epoch`` (EffectFenced: not recorded).

        A completed or failed effect is never overwritten; its row is returned as it is.
        """
        kind = self._began.pop((effect.effect_type, effect.effect_id, attempt), None)
        if kind is None:
            raise OnwardError(f"effect {effect.effect_id[:16]}…: attempt {attempt} was not "
                              "begun by this store; it cannot be recorded (and signed) here")
        final_ref = provider_ref if provider_ref is not None else effect.provider_ref
        result = seal_effect_result(self.keys.crypt, effect, result)
        final_result = result if result is not None else self._stored_result(effect)
        terminal = status in (EffectStatus.COMPLETED, EffectStatus.FAILED)
        row = self.conn.one(_RECORD, {
            "run_id": effect.run_id, "epoch": epoch,
            "effect_type": effect.effect_type, "effect_id": effect.effect_id,
            "attempt": attempt, "outcome": outcome, "status": status.value,
            "provider_ref": provider_ref,
            "result": Jsonb(result) if result is not None else None,
            "error": _jsonb(seal_effect_error(self.keys.crypt, effect, error)),
            "attempt_error": _jsonb(seal_effect_error(self.keys.crypt, effect, error, attempt)),
            "reconciled": reconciled, "poll": 1 if poll else 0,
            "final_ref": final_ref,
            "final_result": Jsonb(final_result) if final_result is not None else None,
            "outcome_mac": self.keys.sign(signed.effect_outcome(
                effect.effect_type, effect.effect_id, status.value, final_ref,
                final_result)) if terminal else None,
            "attempt_mac": self.keys.sign(signed.effect_attempt(
                effect.effect_type, effect.effect_id, attempt, kind.value, effect.effect_id,
                outcome, provider_ref)),
        })
        if row is None:
            raise OnwardError(f"effect {effect.effect_id} vanished")
        if not row["fenced_in"]:
            raise EffectFenced(
                f"effect {effect.effect_id[:16]}… ({effect.effect_type}): the answer to "
                f"attempt {attempt} is not recorded — the lease of epoch {epoch} is no longer "
                "live; the current holder reconciles")
        return opened_effect(self.keys, Effect.from_row(row))

    def _stored_result(self, effect: Effect) -> Any:
        """The effect's result as it is stored (sealed again when it was opened: the row
        keeps one sealed form; a re-seal binds the same place and digest)."""
        return seal_effect_result(self.keys.crypt, effect, effect.result)

    def mark_overran(self, effect: Effect, attempt: int, *, epoch: int,
                     timeout_s: float) -> bool:
        """Mark a call still in flight past its time limit (``CALL_OVERRAN``); False when it
        had ended meanwhile. Safe from another thread: one statement on the pool."""
        row = self.conn.one(_MARK_OVERRAN, {
            "effect_type": effect.effect_type, "effect_id": effect.effect_id,
            "attempt": attempt, "epoch": epoch,
            "error": Jsonb({"type": CALL_OVERRAN, "message": (
                f"the call was still in flight {timeout_s:g}s after it started, past its time "
                "limit: the tool did not give up as its contract says (docs/effects.md), so "
                "the request may still land; a lookup cannot tell until the call has ended")}),
        })
        return row is not None

    def record_late(self, effect: Effect, attempt: int, *, epoch: int, what: str,
                    provider_ref: str | None = None) -> None:
        """Record a call that ended after its lease was lost: outcome ``unknown`` (never the
        effect's outcome), what it answered in the error (``ANSWER_AFTER_LEASE``)."""
        self._began.pop((effect.effect_type, effect.effect_id, attempt), None)
        self.conn.one(_RECORD_LATE, {
            "effect_type": effect.effect_type, "effect_id": effect.effect_id,
            "attempt": attempt, "epoch": epoch, "provider_ref": provider_ref,
            "error": _jsonb(seal_effect_error(self.keys.crypt, effect, {
                "type": ANSWER_AFTER_LEASE, "message": (
                    f"{what} after this call's lease was lost (it overran its time limit, or "
                    "its worker stalled): not the effect's outcome; whoever holds the step "
                    "reconciles by lookup")}, attempt)),
            "attempt_mac": self.keys.sign(signed.effect_attempt(
                effect.effect_type, effect.effect_id, attempt, EffectAttemptKind.CALL.value,
                effect.effect_id, "unknown", provider_ref)),
        })

    def close_unsent(self, run_id: UUID, seq: int, *, epoch: int) -> int:
        """Close the step's effects known never to have reached the provider (``unsent``),
        as failing the run does; fenced on the lease of ``epoch``. How many were closed."""
        return len(self.conn.all(_CLOSE_UNSENT, {"run_id": run_id, "seq": seq,
                                                 "epoch": epoch}))

    def unresolved(self, run_id: UUID) -> list[Effect]:
        """The run's effects whose outcome at the provider is unknown (``OUTCOME_UNKNOWN``)."""
        return [opened_effect(self.keys, Effect.from_row(r))
                for r in self.conn.all(_UNRESOLVED, {"run_id": run_id})]


def _jsonb(value: dict[str, Any] | None) -> Jsonb | None:
    return Jsonb(value) if value is not None else None


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
    """The run's effects, each with ``call_unknown`` (so ``outcome_unknown`` is known)."""
    rows = conn.execute(
        sa.select(effects_table,
                  sa.literal_column(unknown_call("onward.effects")).label("call_unknown"))
        .where(effects_table.c.run_id == run_id)
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
