"""Bad input gets a clear error and costs nothing: a value the ledger cannot keep (a NUL
character, deep nesting, an oversized signal, effect payload or approval artifact, a number
or string a column cannot hold) is refused where it enters, with what to fix, before it is
paid for twice or leaves a run without a way forward. Real PostgreSQL; steps run in this
process through the real executor (tests/support/driver.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus
from ledger.exceptions import IdempotencyConflict, InvalidInput, OnwardError
from ledger.runs import Budgets, Run
from ledger.vocabulary import Role
from tasks import faults
from tasks.llm import LLMResponse
from tests.support import reads
from tests.support.driver import Driver, driver_fixture
from tests.workflows_inputs import MODEL, SENT, nested

MODULES = ["tests.workflows_inputs"]
LIMITS = {"max_json_depth": 8, "max_signal_bytes": 200, "max_effect_payload_bytes": 200,
          "max_approval_artifact_bytes": 200}


@pytest.fixture()
def limited(ledger: Ledger) -> Ledger:
    """The ledger with small limits, as ONWARD_MAX_* settings would set them."""
    return Ledger(ledger.engine, ledger.settings.model_copy(update=LIMITS))


drv = driver_fixture(MODULES, ledger="limited")


def _failed(run: Run) -> str:
    """The run failed for good, its lease released, with a message; return the message."""
    assert run.status is RunStatus.FAILED, run
    assert run.lease_owner is None and run.lease_expires_at is None
    assert run.last_error is not None
    return str(run.last_error["message"])


def test_bad_input__a_nul_in_a_model_answer_is_paid_once_and_fails_the_run(
        limited: Ledger, drv: Driver) -> None:
    """Invariant: bad input costs nothing more. A model answers with a NUL character, which
    PostgreSQL cannot store: the answer is refused with the reason, its spend debited, and
    the run fails at once; the model is paid once (before: on every one of 3 attempts)."""
    before = MODEL.paid
    run = drv.drive(limited.start_run("test_bad_input", {"kind": "nul_answer"}))
    assert MODEL.paid - before == 1
    message = _failed(run)
    assert run.last_error is not None and run.last_error["reason"] == "invalid_answer"
    assert "NUL" in message and "$.text" in message
    assert (run.used_tokens, float(run.used_cost_usd)) == (60, 0.6)
    assert run.attempts_total == 1


def test_bad_input__a_run_failed_invalid_answer_is_continued_once_the_model_is_fixed(
        limited: Ledger, drv: Driver) -> None:
    """Invariant: every run is terminal, parked or has a way forward, and its error says
    which. A run failed ``invalid_answer`` says that continuing asks the model again, paid
    again; continue is allowed (audited), and once the provider answers plain text the
    step asks once more, records the answer and the run completes: two paid calls in all,
    both debited, no budget refilled."""
    before = MODEL.paid
    run_id = limited.start_run("test_bad_input", {"kind": "nul_answer"})
    message = _failed(drv.drive(run_id))
    assert "continue the run" in message and "paid again" in message
    MODEL.fixed = True
    try:
        limited.acting_as("olga", Role.OPERATOR).continue_run(run_id, "the provider is fixed")
        run = drv.drive(run_id)
    finally:
        MODEL.fixed = False
    assert run.status is RunStatus.COMPLETED, run.last_error
    assert MODEL.paid - before == 2
    [refusal] = _refusals(limited, run_id)  # the continue cleared it: the step asked again
    assert refusal["cleared_at"] is not None
    assert (run.used_tokens, float(run.used_cost_usd)) == (120, 1.2)
    [continued] = limited.audit(run_id=run_id, action="continue")
    assert continued.details["last_error"]["reason"] == "invalid_answer"


def _refusals(ledger: Ledger, run_id: Any) -> list[dict[str, Any]]:
    with ledger.engine.connect() as conn:
        return [dict(row) for row in conn.execute(sa.text(
            "SELECT * FROM onward.refused_answers WHERE run_id = :r ORDER BY id"),
            {"r": run_id}).mappings()]


def test_bad_input__a_refused_answer_is_recorded_with_its_debit_and_never_asked_again(
        limited: Ledger, drv: Driver, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """Invariant: no call is paid twice unless a person asks (issue 10, F9). The answer
    with a NUL is debited and its refusal recorded in one statement: its sha256 and size,
    the reason, the spend, never the bytes. The step then dies before the run is failed
    (fault after_answer_refused, raised once, standing for a crash): the retried attempt
    finds the refusal and fails the run ``invalid_answer`` without calling the model again
    (before: the retry called, and paid, again: 2 calls, 120 tokens)."""
    monkeypatch.setenv("ONWARD_FAULTS", "after_answer_refused:raise:once")
    monkeypatch.setenv("ONWARD_FAULTS_DIR", str(tmp_path))
    faults.arm_from_env()
    before = MODEL.paid
    try:
        run = drv.drive(limited.start_run("test_bad_input", {"kind": "nul_answer"}))
    finally:
        monkeypatch.delenv("ONWARD_FAULTS")
        faults.arm_from_env()
    assert MODEL.paid - before == 1
    message = _failed(run)
    assert run.last_error is not None and run.last_error["reason"] == "invalid_answer"
    assert "NUL" in message and "continue the run" in message
    assert (run.used_tokens, float(run.used_cost_usd)) == (60, 0.6)
    assert [a["outcome"] for a in reads.attempts(limited.engine, run.id)] == ["failed",
                                                                             "failed"]
    [refusal] = _refusals(limited, run.id)
    answer = LLMResponse(text="before\x00after", model="m", input_tokens=50, output_tokens=10,
                         cost_usd=0.6).as_record()
    body = json.dumps(answer, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()
    assert (refusal["answer_bytes"], refusal["answer_sha256"]) == (
        len(body), hashlib.sha256(body).hexdigest())
    assert "NUL" in refusal["reason"] and refusal["cleared_at"] is None
    assert (refusal["input_tokens"], refusal["output_tokens"]) == (50, 10)
    assert refusal["command_id"] == "hand_over@0#1" and refusal["source"] == "m"


def test_bad_input__a_nul_in_a_state_update_is_a_step_failure(limited: Ledger,
                                                              drv: Driver) -> None:
    """Invariant: every run is terminal, parked or has a way forward. A state update with a
    NUL character is refused by canonical JSON with its place, as a failure of the step
    recorded in the ledger; before, the commit statement raised and the worker kept the
    lease until the run parked as 'worker lost'."""
    run = drv.drive(limited.start_run("test_bad_input", {"kind": "nul_state"}))
    message = _failed(run)
    assert "NUL" in message and "$.note" in message
    outcomes = [a["outcome"] for a in reads.attempts(limited.engine, run.id)]
    assert outcomes == ["failed"]


@pytest.mark.parametrize("kind", ["nul_approver", "nul_signal"])
def test_bad_input__an_error_raised_by_the_commit_is_a_step_failure(
        limited: Ledger, drv: Driver, kind: str) -> None:
    """Invariant: every run is terminal, parked or has a way forward. A wait whose approver
    or signal name holds a NUL character makes the commit fail (the database refuses the
    value, or the checkpoint's canonical JSON does): the step fails, recorded in the ledger,
    with the lease released, instead of the error escaping with the lease held."""
    run = drv.drive(limited.start_run("test_bad_input", {"kind": kind}))
    message = _failed(run)
    assert "commit" in message
    assert [a["outcome"] for a in reads.attempts(limited.engine, run.id)] == ["failed"]


@pytest.mark.parametrize(("kind", "setting"), [
    ("deep_state", "ONWARD_MAX_JSON_DEPTH"),
    ("deep_payload", "ONWARD_MAX_JSON_DEPTH"),
    ("deep_artifact", "ONWARD_MAX_JSON_DEPTH"),
    ("big_payload", "ONWARD_MAX_EFFECT_PAYLOAD_BYTES"),
    ("big_artifact", "ONWARD_MAX_APPROVAL_ARTIFACT_BYTES"),
])
def test_bad_input__a_step_over_the_configured_limits_fails_and_sends_nothing(
        limited: Ledger, drv: Driver, kind: str, setting: str) -> None:
    """Invariant: limits come from settings and nothing over them is stored or sent. A state
    nested 9 deep (limit 8), an effect payload or an approval artifact nested 9 deep or over
    200 bytes: the step fails naming the setting; no effect is recorded or sent, no approval
    is asked."""
    sent = len(SENT)
    run = drv.drive(limited.start_run("test_bad_input", {"kind": kind, "depth": 9,
                                                         "size": 300}))
    assert setting in _failed(run)
    assert len(SENT) == sent
    assert limited.effects(run.id) == []
    assert limited.approvals(run_id=run.id) == []


def test_bad_input__signals_over_the_limits_are_refused(limited: Ledger, drv: Driver) -> None:
    """Invariant: limits come from settings. A signal payload over ONWARD_MAX_SIGNAL_BYTES,
    nested deeper than ONWARD_MAX_JSON_DEPTH, or holding a NUL character, and a signal name
    with a NUL, are refused with the reason; nothing is stored and the run still waits."""
    ops = limited.acting_as("olga", "operator")
    run_id = limited.start_run("test_bad_input", {"kind": "wait"})
    assert drv.drive(run_id).status is RunStatus.WAITING
    for payload, reason in (({"doc": "x" * 300}, "ONWARD_MAX_SIGNAL_BYTES"),
                            (nested(9), "ONWARD_MAX_JSON_DEPTH"),
                            ({"doc": "a\x00b"}, "NUL")):
        with pytest.raises(InvalidInput, match=reason):
            ops.signal(run_id, "go", payload)
    with pytest.raises(InvalidInput, match="NUL"):
        ops.signal(run_id, "go\x00", {})
    assert reads.execute(limited.engine, "SELECT 1 FROM onward.signals WHERE run_id = :id",
                         id=run_id) == 0
    assert ops.signal(run_id, "go", {"ok": True}) is True


START_CASES: dict[str, Callable[[Ledger], Any]] = {
    "nul in input": lambda led: led.start_run("test_bad_input", {"note": "a\x00b"}),
    "nul in a key": lambda led: led.start_run("test_bad_input", {"a\x00": 1}),
    "deep input": lambda led: led.start_run("test_bad_input", {"data": nested(70)}),
    "very deep input": lambda led: led.start_run("test_bad_input", {"data": nested(5000)}),
    "nul in conversation": lambda led: led.start_run("test_bad_input", {},
                                                     conversation_id="c\x00"),
    "nul in key": lambda led: led.start_run("test_bad_input", {}, idempotency_key="k\x00"),
    "nul in workflow": lambda led: led.start_run("test\x00", {}),
    "conversation not text": lambda led: led.start_run("test_bad_input", {},
                                                       conversation_id=5),  # type: ignore
    "max_attempts too large": lambda led: led.start_run("test_bad_input", {},
                                                        max_attempts=10**12),
    "max_attempts negative": lambda led: led.start_run("test_bad_input", {}, max_attempts=-1),
    "cost overflow": lambda led: led.start_run("test_bad_input", {},
                                               budgets=Budgets(cost_usd=1e9)),
    "cost not a number": lambda led: led.start_run("test_bad_input", {},
                                                   budgets=Budgets(cost_usd=float("nan"))),
    "tokens overflow": lambda led: led.start_run("test_bad_input", {},
                                                 budgets=Budgets(tokens=10**12)),
    "tokens negative": lambda led: led.start_run("test_bad_input", {},
                                                 budgets=Budgets(tokens=-5)),
    "deadline negative": lambda led: led.start_run(
        "test_bad_input", {}, budgets=Budgets(deadline=timedelta(seconds=-1))),
}


@pytest.mark.parametrize("case", list(START_CASES))
def test_start_run__bad_input_raises_an_onward_error_and_writes_nothing(
        ledger: Ledger, case: str) -> None:
    """Invariant: start_run raises onward errors, never driver errors. Each bad start is
    refused with InvalidInput saying what is wrong, and writes no run."""
    before = reads.fingerprint(ledger.engine).runs
    with pytest.raises(OnwardError) as raised:
        START_CASES[case](ledger)
    assert isinstance(raised.value, InvalidInput), repr(raised.value)
    assert reads.fingerprint(ledger.engine).runs == before


def test_start_run__idempotency_compares_canonical_json(ledger: Ledger) -> None:
    """Invariant: a key must not change its request. {"flag": 1} and {"flag": true} are
    different inputs (Python says 1 == True): the second start conflicts. The same number
    written 1 or 1.0 is the same JSON, and returns the same run."""
    first = ledger.start_run("test_bad_input", {"size": 1}, idempotency_key="flag-1")
    assert ledger.start_run("test_bad_input", {"size": 1.0}, idempotency_key="flag-1") == first
    ledger.start_run("test_bad_input", {"data": {"flag": 1}}, idempotency_key="flag-2")
    with pytest.raises(IdempotencyConflict):
        ledger.start_run("test_bad_input", {"data": {"flag": True}}, idempotency_key="flag-2")
