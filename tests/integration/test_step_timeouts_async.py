"""Async steps and step timeouts, executed in the test process against the real ledger
(docs/steps.md). The model and the provider are in-process (tests/workflows_async_local),
so every call is counted; the step runs in this process's main thread (where a plain
step's timeout interrupts it, as in a prefork child) or in a thread of its own (where it
cannot, as on the threads pool)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus
from ledger.steps import Claim, StepStore
from ledger.vocabulary import Role
from tasks.workflow import Registry
from tests.support import reads
from tests.support.async_local import LOCAL, MODULES, local_fixture
from tests.support.driver import Driver, driver_fixture

local = local_fixture()


drv = driver_fixture(MODULES)


def in_thread(work: Callable[[], Any]) -> Any:
    """``work()`` on a thread that is not the main one (the threads pool's situation)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    thread.join(timeout=60)
    return result[0]


def error_types(ledger: Ledger, run_id: UUID) -> list[tuple[str | None, str | None]]:
    return [(a["outcome"], a["error_type"]) for a in reads.attempts(ledger.engine, run_id)]


def test_async_step__same_protocol_as_a_plain_step(ledger: Ledger, drv: Driver,
                                                   local: None) -> None:
    """Invariant (resume, never repeat): an async step's awaited ctx.llm and ctx.effect
    (an async model client, an async tool) are recorded like a plain step's: attempt 1
    fails after its effect; attempt 2 gets the recorded answer and the recorded effect back
    (the model asked once, one object sent), and the run completes. Calls gathered in one
    go keep their order: their command ids follow the order they were started in."""
    run_id = ledger.start_run("local_async", {"fail_first": True})
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    assert LOCAL.sends == 1 and LOCAL.lookups == 0
    assert LOCAL.model_calls.count("plan") == 1
    assert sorted(LOCAL.model_calls) == ["part 0", "part 1", "part 2", "plan"]
    assert run.result == {"offer_id": "obj_1",
                          "parts": ["re: part 0", "re: part 1", "re: part 2"]}
    assert error_types(ledger, run_id) == [("failed", "StepError"), ("committed", None),
                                           ("committed", None)]
    with ledger.engine.connect() as conn:
        fanned = conn.execute(sa.text(
            "SELECT command_id, response FROM onward.evidence WHERE run_id = :id AND "
            "step = 'fan_out' ORDER BY command_id"), {"id": run_id}).all()
    assert [(r.command_id, r.response["text"]) for r in fanned] == [
        ("fan_out@1#1", "re: part 0"), ("fan_out@1#2", "re: part 1"),
        ("fan_out@1#3", "re: part 2")]
    assert ledger.acting_as("olga", Role.OPERATOR).verify_run(run_id) == []


@pytest.mark.parametrize("where", ["main_thread", "other_thread"])
def test_timeout__a_plain_step_past_it_is_retried_and_its_effect_not_repeated(
        ledger: Ledger, drv: Driver, local: None, where: str) -> None:
    """Invariant: a step that runs past its timeout (0.5 s; its first attempt hangs 3 s
    after its effect) is not committed: the attempt is recorded failed ``StepTimedOut``,
    the next attempt gets the recorded effect back, one object. In the main thread (prefork)
    the body is interrupted (it never wakes); in another thread (threads pool) it cannot
    be, and what it returns late is refused."""
    run_id = ledger.start_run("local_sync_timeout", {"hang_s": 3.0})
    first = drv.step(run_id, 0) if where == "main_thread" else in_thread(
        lambda: drv.step(run_id, 0))
    assert first.kind.value == "retry", first
    assert LOCAL.woke == ([] if where == "main_thread" else [1])
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    assert LOCAL.sends == 1 and run.result == {"offer_id": "obj_1"}
    assert error_types(ledger, run_id) == [("failed", "StepTimedOut"), ("committed", None)]


@pytest.mark.parametrize("where", ["main_thread", "other_thread"])
def test_timeout__a_call_in_flight_is_reconciled_not_resent(
        ledger: Ledger, drv: Driver, local: None, where: str) -> None:
    """Invariant (never a blind resend): the provider acts, then holds its answer 2 s past
    the step's 0.5 s timeout. Interrupted (main thread), the call's attempt is recorded with
    its outcome unknown, and the next attempt looks the key up (found) instead of sending
    again. On another thread the answer is recorded when it comes, and the late step is
    refused. Either way: one object, one send."""
    run_id = ledger.start_run("local_sync_timeout", {"hold_s": 2.0})
    report = drv.step(run_id, 0) if where == "main_thread" else in_thread(
        lambda: drv.step(run_id, 0))
    assert report.kind.value == "retry", report
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    assert LOCAL.sends == 1 and run.result == {"offer_id": "obj_1"}
    assert LOCAL.lookups == (1 if where == "main_thread" else 0)
    assert error_types(ledger, run_id)[0] == ("failed", "StepTimedOut")
    ops = ledger.acting_as("olga", Role.OPERATOR)
    [effect] = ops.effects(run_id)
    outcomes = [(a.kind, a.outcome) for a in ops.effect_attempts(effect)]
    expected = ([("call", "unknown"), ("lookup", "found")] if where == "main_thread"
                else [("call", "completed")])
    assert outcomes == expected


@pytest.mark.parametrize("case", ["hang_after_effect", "call_in_flight"])
def test_timeout__an_async_step_is_cancelled_at_it(ledger: Ledger, drv: Driver, local: None,
                                                   case: str) -> None:
    """Invariant: an async step is cancelled at its timeout wherever it is awaiting: in its
    own code (it never wakes) or in an async tool's call, whose attempt is then recorded
    unknown and reconciled by lookup on the next attempt. One object either way."""
    state = {"hang_s": 3.0} if case == "hang_after_effect" else {"hold_s": 3.0}
    run_id = ledger.start_run("local_async_timeout", state)
    report = in_thread(lambda: drv.step(run_id, 0))  # async steps interrupt on any thread
    assert report.kind.value == "retry", report
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    assert LOCAL.sends == 1 and LOCAL.woke == []
    assert LOCAL.lookups == (1 if case == "call_in_flight" else 0)
    assert error_types(ledger, run_id) == [("failed", "StepTimedOut"), ("committed", None)]


def test_claim__leases_a_step_for_its_timeout_and_the_margin(ledger: Ledger) -> None:
    """Invariant: a claim of a step with a timeout takes a lease of at least the timeout and
    the margin (the default lease here is 1 s), for a run's first step (its row names no
    step) as for a later one; a step without a timeout keeps the default."""
    registry = Registry()
    registry.load_modules(MODULES)
    leases = registry.step_leases(5.0)
    store = StepStore(ledger.url, ledger.keys, lease_ttl_s=1.0)
    try:
        timed = ledger.start_run("local_sync_timeout", {})
        plain = ledger.start_run("local_async", {})
        claims = [store.claim(run, 0, "test:1", leases=leases) for run in (timed, plain)]
    finally:
        store.close()
    lengths = []
    for claim in claims:
        assert isinstance(claim, Claim)
        row = reads.run_row(ledger.engine, claim.run_id)
        lengths.append(row["lease_expires_at"] - claim.claimed_at)
    assert lengths == [timedelta(seconds=5.5), timedelta(seconds=1)]
