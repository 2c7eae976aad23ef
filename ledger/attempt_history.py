"""Whether an effect's attempts are as onward recorded them (docs/guarantees.md, integrity).

What a retried step does with an effect that is not finished depends on its attempts: one
that may have reached the provider is reconciled (looked up) before anything is sent again,
and one that saw the effect completed means it was sent. The worker checks them before it
acts on them (``EffectStore.check_attempts``), and ``onward verify`` reports the same
problems."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from ledger import signed, sql
from ledger.checkpoints import CheckpointKeys
from ledger.exceptions import IntegrityViolation
from ledger.vocabulary import EffectAttemptKind, EffectAttemptOutcome, EffectStatus

if TYPE_CHECKING:
    from ledger.effects import Effect

__all__ = ["attempt_problems", "attempt_problems_txn", "check_attempts_txn",
           "checked_rows_problems"]

_ATTEMPTS_CHECKED = sql.text("effect_attempts_checked")


_SAW_REF = (EffectAttemptOutcome.ACCEPTED, EffectAttemptOutcome.FOUND,
            EffectAttemptOutcome.COMPLETED)


def attempt_problems(keys: CheckpointKeys, effect_type: str, effect_id: str, begun: int,
                     status: EffectStatus, rows: Sequence[Mapping[Any, Any]],
                     provider_ref: str | None = None) -> Iterator[str]:
    """What is wrong with the effect's attempt ``rows`` (in attempt order), given the
    ``begun`` count, the ``status`` and the ``provider_ref`` its row holds: attempts
    numbered other than 1..begun (one deleted or inserted), an attempt that ended whose MAC
    does not match (its outcome, kind, key or provider reference edited, or a forged row),
    an attempt that saw the effect completed while the effect says otherwise (its outcome
    edited), or an accepted effect whose provider reference (the job its status is polled
    at) is not the one its latest attempt to learn one was given (edited)."""
    what = f"effect {effect_type} {effect_id[:16]}…"
    numbers = [row["attempt"] for row in rows]
    if numbers != list(range(1, begun + 1)):
        yield (f"{what}: {begun} attempt(s) were begun, the attempt rows are numbered "
               f"{numbers} (deleted outside onward)")
    elif not rows and status in (EffectStatus.COMPLETED, EffectStatus.FAILED):
        yield f"{what} is {status.value} with no attempt rows (deleted outside onward)"
    for row in rows:
        if row["outcome"] is None and row["ended_at"] is None and row["mac"] is None:
            continue  # still in flight, or its worker died before it ended
        try:
            keys.check(signed.effect_attempt(
                effect_type, effect_id, row["attempt"], row["kind"], row["idempotency_key"],
                row["outcome"], row["provider_ref"]),
                row["mac"], f"{what}: attempt {row['attempt']}")
        except IntegrityViolation as exc:
            yield str(exc)
    seen_completed = any(row["outcome"] == EffectAttemptOutcome.COMPLETED for row in rows)
    # a lookup or a person that found the object (or the job: then it may be accepted)
    seen_found = any(row["outcome"] == EffectAttemptOutcome.FOUND for row in rows)
    if (seen_completed and status not in (EffectStatus.COMPLETED, EffectStatus.FAILED)) or (
            seen_found and status not in (EffectStatus.COMPLETED, EffectStatus.FAILED,
                                          EffectStatus.ACCEPTED)):
        yield (f"{what} is {status.value}, but an attempt saw it completed (its status was "
               "edited outside onward)")
    if status is EffectStatus.ACCEPTED:
        refs = [row["provider_ref"] for row in rows
                if row["kind"] != EffectAttemptKind.REPEAT  # a repeat's job is its own
                and row["outcome"] in _SAW_REF and row["provider_ref"] is not None]
        if not refs or refs[-1] != provider_ref:
            yield (f"{what} is accepted at the provider's reference {provider_ref!r}, which "
                   f"no attempt was given{f' (the latest: {refs[-1]!r})' if refs else ''}: "
                   "edited outside onward")


def checked_rows_problems(keys: CheckpointKeys, effect_type: str, effect_id: str,
                          rows: Sequence[Mapping[Any, Any]]) -> Iterator[str]:
    """What is wrong with the effect as ``rows`` of statement ``effect_attempts_checked``
    show it (its attempts, each with the effect's begun count, status and provider
    reference as of the same snapshot; no row at all: the effect's row is gone)."""
    if not rows:
        yield f"effect {effect_type} {effect_id[:16]}…: its row is gone (deleted outside onward)"
        return
    yield from attempt_problems(keys, effect_type, effect_id, rows[0]["begun"],
                                EffectStatus(rows[0]["effect_status"]),
                                [row for row in rows if row["attempt"] is not None],
                                rows[0]["effect_provider_ref"])


def attempt_problems_txn(conn: Connection, keys: CheckpointKeys,
                         effect: Effect) -> Iterator[str]:
    """What is wrong with ``effect``'s attempts, read in the caller's transaction with the
    statement the worker's check runs (``effect_attempts_checked``): what an operator's
    repeat relies on and what ``onward verify`` reports."""
    rows = conn.execute(_ATTEMPTS_CHECKED, {"effect_type": effect.effect_type,
                                            "effect_id": effect.effect_id}).mappings().all()
    yield from checked_rows_problems(keys, effect.effect_type, effect.effect_id, rows)


def check_attempts_txn(conn: Connection, keys: CheckpointKeys, effect: Effect) -> None:
    """Raise IntegrityViolation unless ``effect``'s attempts (read in the caller's
    transaction, with the effect's row locked there) are as onward recorded them: what
    an operator's repeat relies on (its key's number counts the repeats before it)."""
    for problem in attempt_problems_txn(conn, keys, effect):
        raise IntegrityViolation(f"{problem}: nothing was repeated")
