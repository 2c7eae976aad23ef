"""The effect attempts' checks (ledger/attempt_history.py), on rows as onward records them."""

from __future__ import annotations

from typing import Any

import pytest

from ledger import signed
from ledger.attempt_history import attempt_problems
from ledger.checkpoints import CheckpointKeys
from ledger.vocabulary import EffectStatus

KEYS = CheckpointKeys(current="k1", keys={"k1": b"one"})
EFFECT = ("model.blind", "e" * 64)


def _attempt(number: int, kind: str, outcome: str | None, ref: str | None) -> dict[str, Any]:
    """An attempt row; one that ended is signed as the statement that ends it signs it."""
    mac = None if outcome is None else KEYS.sign(signed.effect_attempt(
        *EFFECT, number, kind, "key", outcome, ref))
    return {"attempt": number, "kind": kind, "idempotency_key": "key", "outcome": outcome,
            "provider_ref": ref, "ended_at": None if outcome is None else "then", "mac": mac}


# a call whose worker died (open), then what learned the effect completed: a lookup that
# found the object, or a person's resolution (kind resolve, outcome found)
LEARNED = {
    "lookup_found": [_attempt(1, "call", None, None), _attempt(2, "lookup", "found", "obj_1")],
    "resolved_found": [_attempt(1, "call", None, None),
                       _attempt(2, "resolve", "found", "obj_1")],
}


@pytest.mark.parametrize("case", sorted(LEARNED))
@pytest.mark.parametrize("status", [EffectStatus.UNSENT, EffectStatus.PENDING])
def test_attempt_problems__an_effect_found_completed_made_to_look_unsent(
        case: str, status: EffectStatus) -> None:
    """Invariant: an effect whose attempt found its object at the provider (a lookup, or a
    person's resolution) and that says it is unsent or pending was edited outside onward
    (its status set back, the outcome's MAC left): reported, so a retried step parks
    ``integrity`` instead of sending it again and ``verify`` names it. Found by the model
    test's tamper rule (verify reported nothing)."""
    problems = list(attempt_problems(KEYS, *EFFECT, 2, status, LEARNED[case], "obj_1"))

    assert any("an attempt saw it completed" in p for p in problems), problems


@pytest.mark.parametrize("case", sorted(LEARNED))
@pytest.mark.parametrize("status", [EffectStatus.COMPLETED, EffectStatus.ACCEPTED])
def test_attempt_problems__an_effect_found_and_recorded_so_is_clean(
        case: str, status: EffectStatus) -> None:
    """Invariant (no false alarm): the same attempts on an effect recorded completed (or
    accepted: a lookup may find the provider's job) are clean."""
    assert list(attempt_problems(KEYS, *EFFECT, 2, status, LEARNED[case], "obj_1")) == []
