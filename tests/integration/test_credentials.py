"""No secret at rest (issue 15 item 3): a tool reads its credential by reference when it
calls, and the value is in no table, whatever the step does with it: a step that copies it
into an effect payload or a state is refused before anything is recorded, and a tool error
that quotes it is recorded masked. Real PostgreSQL; runs executed in-process through the
real executor; every row of every onward table scanned."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from ledger import Ledger, RunStatus
from tasks import credentials
from tests.support.driver import Driver, driver
from tests.support.reads import places_holding

VALUE = "crm-token-7Qx2-canary"


@pytest.fixture()
def drv(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    monkeypatch.setattr(credentials, "_known", set())
    monkeypatch.setenv("ONWARD_SECRET_TEST_CRM_TOKEN", VALUE)
    with driver(ledger, ["tests.workflows_credentials"]) as running:
        yield running


def _run(drv: Driver, state: dict[str, Any]) -> Any:
    run_id = drv.ledger.start_run("test_credentials", state)
    return drv.drive(run_id)


def test_a_credential_read_by_reference_is_recorded_nowhere(drv: Driver) -> None:
    run = _run(drv, {})
    assert run.status is RunStatus.COMPLETED
    assert credentials.held_in(VALUE.encode())  # the tool did read it, in this process
    assert places_holding(drv.ledger.url, VALUE) == []


@pytest.mark.parametrize("misuse", ["payload", "state"])
def test_a_step_that_copies_a_credential_is_refused_before_recording_it(
        drv: Driver, misuse: str) -> None:
    """A resolved credential put into an effect payload (or the state) fails the step
    (OutcomeError: the code is wrong) before the effect (or the checkpoint) is written."""
    run = _run(drv, {"misuse": misuse})
    assert run.status is RunStatus.FAILED
    assert "credential" in json.dumps(run.last_error)
    assert places_holding(drv.ledger.url, VALUE) == []
    if misuse == "payload":
        assert drv.ledger.effects(run.id) == []


def test_a_tool_error_quoting_the_credential_is_recorded_masked(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONWARD_TEST_CRM_REFUSES", "1")
    run = _run(drv, {})
    assert run.status is RunStatus.FAILED
    assert "the token ***" in json.dumps(run.last_error)
    assert places_holding(drv.ledger.url, VALUE) == []
