"""A call without ``key=`` is named by its position in the step (docs/steps.md): a retry
that makes its calls in another order parks the run, and the park says why and what to do,
executed in the test process against the real ledger (tests/workflows_async_local)."""

from __future__ import annotations

import pytest

from ledger import Ledger, RunStatus
from tests.support.async_local import LOCAL, MODULES, local_fixture
from tests.support.driver import Driver, driver_fixture

drv = driver_fixture(MODULES)


local = local_fixture()


@pytest.mark.parametrize(("calls", "reason"), [("effects", "effect_conflict"),
                                               ("models", "evidence_conflict")])
def test_call_positions__a_retry_in_another_order_parks_naming_the_cause(
        ledger: Ledger, drv: Driver, local: None, calls: str, reason: str) -> None:
    """Invariant: a retry whose keyless calls come in another order takes nothing recorded
    for another call (no second object, no answer to another request): the run is parked,
    and the park names the cause (the call is named by its position) and the remedy
    (key=), not only that the request changed."""
    run_id = ledger.start_run("local_reordered", {"calls": calls})
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, reason)
    assert LOCAL.sends == (2 if calls == "effects" else 0)
    assert len(LOCAL.model_calls) == (2 if calls == "models" else 0)
    message = run.last_error["message"]
    assert "#1" in message and "has no key=, so it is named by its position" in message
    assert "give each call whose order can change a key=" in message
