"""An operator's cancel meets an effect of unknown outcome whose sealed values can no longer
be opened (its tenant's data keys were erased): the worker parks the run for a person, it
does not die (found by the model test: ``SealedValueUnreadable`` raised out of
``execute_step`` while listing the unresolved effects, whose sealed provider error could not
be opened). The encrypted settings come from tests/support/crypt.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledger import Ledger, RunStatus
from ledger.vocabulary import EffectStatus, Role
from tests.support.crypt import settings_env
from tests.support.driver import Driver, driver
from tests.workflows_outcomes import OUTSIDE

__all__ = ["settings_env"]


@pytest.fixture()
def drv(ledger: Ledger) -> Iterator[Driver]:
    OUTSIDE.reset()
    with driver(ledger.acting_as("olga", Role.OPERATOR), ["tests.workflows_outcomes"]) as running:
        yield running
    OUTSIDE.reset()


def test_cancel__an_unknown_effect_whose_keys_were_erased_parks_the_run(drv: Driver) -> None:
    """Given a run between retries whose first call lost its answer and whose second was
    refused (its error sealed), cancel requested, then the tenant's keys erased; when a
    worker takes the cancel, expect the run parked for review, the effect still pending
    (never closed unsent) and the provider not called again."""
    OUTSIDE.lose_answers, OUTSIDE.refuse = 1, 1
    run_id = drv.ledger.start_run("test_outcome_send", {"tool": "keyed"})
    drv.step(run_id, 0)
    drv.step(run_id, 0)
    assert drv.ledger.cancel(run_id, "customer withdrew").requested is True
    crypt = drv.ledger.keys.crypt  # the worker's keyring: it forgets the erased keys at once
    assert crypt is not None and crypt.erase_tenant("default") >= 1
    run = drv.drive(run_id)
    assert run.status is RunStatus.NEEDS_REVIEW, run
    assert run.parked_reason == "effect_outcome_unknown", run
    (effect,) = drv.ledger.effects(run_id)
    assert effect.status is EffectStatus.PENDING
    assert OUTSIDE.count() == 1
