"""Whether an effect's attempts are as onward recorded them (docs/guarantees.md, integrity).

What a retried step does with an effect that is not finished depends on its attempts: one
that may have reached the provider is reconciled (looked up) before anything is sent again,
and one that saw the effect completed means it was sent. The worker checks them before it
acts on them (``EffectStore.check_attempts``), and ``onward verify`` reports the same
problems."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ledger import signed
from ledger.checkpoints import CheckpointKeys
from ledger.exceptions import IntegrityViolation
from ledger.schema import effect_attempts
from ledger.vocabulary import EffectAttemptKind, EffectAttemptOutcome, EffectStatus

if TYPE_CHECKING:
    from ledger.effects import Effect

__all__ = ["attempt_problems", "check_attempts_txn"]


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
    if seen_completed and status not in (EffectStatus.COMPLETED, EffectStatus.FAILED):
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


def check_attempts_txn(conn: Connection, keys: CheckpointKeys, effect: Effect) -> None:
    """Raise IntegrityViolation unless ``effect``'s attempts (read in the caller's
    transaction, ``effect`` as its row was read there) are as onward recorded them: what
    an operator's repeat relies on (its key's number counts the repeats before it)."""
    rows = conn.execute(sa.select(effect_attempts).where(
        effect_attempts.c.effect_type == effect.effect_type,
        effect_attempts.c.effect_id == effect.effect_id).order_by(effect_attempts.c.attempt)
    ).mappings().all()
    for problem in attempt_problems(keys, effect.effect_type, effect.effect_id,
                                    effect.attempts, effect.status, rows,
                                    effect.provider_ref):
        raise IntegrityViolation(f"{problem}: nothing was repeated")
