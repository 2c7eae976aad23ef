"""An async step's calls without a key: one cancelled while it waits in the step's queue is
never made but keeps its number, and a refusal the body's gather swallowed still stops the
step (docs/steps.md, "Async steps"); executed in the test process against the real ledger."""

from __future__ import annotations

import pytest

from ledger import Ledger, RunStatus
from ledger.vocabulary import EffectStatus
from tests.support.async_local import LOCAL, MODULES, local_fixture
from tests.support.driver import Driver, driver_fixture

drv = driver_fixture(MODULES)


local = local_fixture()


def test_async_call__cancelled_while_queued_is_never_made(
        ledger: Ledger, drv: Driver, local: None) -> None:
    """Invariant: a keyless ctx.effect cancelled before the step's thread took it records
    no intent and sends nothing: the run completes with the one effect that was made,
    ``completed``, and no effect row left ``pending``."""
    run_id = ledger.start_run("local_cancelled_queued", {})
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED
    assert run.result == {"sent": 1}
    assert LOCAL.sends == 1
    assert [(e.status, e.command_id) for e in ledger.effects(run_id)] == [
        (EffectStatus.COMPLETED, "cancel_the_second@0#1")]


def test_async_call__a_refusal_swallowed_by_gather_still_stops_the_step(
        ledger: Ledger, drv: Driver, local: None) -> None:
    """Invariant: a call refused (a keyless call in a helper task) does not become a commit
    because the body gathered with ``return_exceptions=True`` and went on: the run fails
    with the refusal, as when it is raised, and nothing is sent."""
    run_id = ledger.start_run("local_swallowed_refusal", {})
    run = drv.drive(run_id)
    assert run.status is RunStatus.FAILED
    assert run.last_error["type"] == "OutcomeError"
    assert run.seq == 0
    assert LOCAL.sends == 0
    assert ledger.effects(run_id) == []


@pytest.mark.parametrize("same", [False, True], ids=["payloads_differ", "same_payload"])
def test_async_call__cancelled_while_queued_keeps_its_position(
        ledger: Ledger, drv: Driver, local: None, same: bool) -> None:
    """Invariant: a keyless call is numbered when the body makes it, so one cancelled while
    queued still takes its number and the calls after it keep theirs. Attempt 1 makes
    ``first`` (#1), cancels ``second`` (#2) in the queue and makes ``third`` (#3), then
    fails; attempt 2 makes all three: ``first`` and ``third`` get their recorded answers
    back and ``second`` alone is sent. Numbered as dequeued instead, ``third`` was #2 on
    attempt 1, so on attempt 2 ``second`` found ``third``'s record under its command id:
    with another payload the run parked ``effect_conflict``; with the same payload it
    silently took ``third``'s object for its own and ``third`` was sent again."""
    run_id = ledger.start_run("local_cancel_shifts", {"same": same})
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, (run.status, run.last_error)
    # objects are numbered as the provider made them: first and third on attempt 1
    assert run.result == {"ids": {"first": "obj_1", "second": "obj_3", "third": "obj_2"}}
    assert LOCAL.sends == 3
    made = {e.command_id: e.status for e in ledger.effects(run_id)}
    assert made == {f"cancel_then_send@0#{n}": EffectStatus.COMPLETED for n in (1, 2, 3)}
