"""Whether an approved step really began before its approval expired (docs/guarantees.md).

An approval authorises the approved step that starts before it expires, so a retry after
the expiry goes on when the step's first attempt began in time. When that first attempt
began is read from ``step_attempts``, which nothing signs: a row inserted with an earlier
start would let a step whose first attempt begins after the expiry run. So a retry after
the expiry also needs what an attempt in time leaves signed: an effect or a recorded
answer of that step, at that seq, whose MAC verifies. An attempt in time that recorded
nothing lost nothing: refusing its retry loses nothing either."""

from __future__ import annotations

from uuid import UUID

from ledger import sql
from ledger.checkpoints import CheckpointKeys
from ledger.effects import Effect, check_effect
from ledger.evidence import checked_response
from ledger.exceptions import IntegrityViolation, OperationRefused
from ledger.hot import HotConnection

__all__ = ["recorded_signed"]

_EFFECTS = sql.statement("effects_at_seq")
_EVIDENCE = sql.statement("evidence_at_seq")


def recorded_signed(conn: HotConnection, keys: CheckpointKeys, run_id: UUID, seq: int) -> bool:
    """Whether the step at ``seq`` of ``run_id`` recorded an effect or an answer that
    verifies against its MAC (one or two statements, off the hot path)."""
    params = {"run_id": run_id, "seq": seq}
    for row in conn.all(_EFFECTS, params):
        try:
            check_effect(keys, Effect.from_row(row))
        except IntegrityViolation:
            continue
        return True
    for row in conn.all(_EVIDENCE, params):
        try:
            checked_response(keys, row, compacted_ok=True)
        except (IntegrityViolation, OperationRefused):
            continue
        return True
    return False
