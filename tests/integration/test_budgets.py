"""Budgets are never refilled (docs/design.md section 6): what a step paid for is debited
when the answer is recorded, whatever happens to the step afterwards. Steps run in this
process through the real executor and ledger (tests/support/driver.py); the crash case,
with a real worker SIGKILLed mid-step, is in tests/acceptance/test_budgets.py."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from harness.waiting import wait_for
from ledger import Ledger, RunStatus
from ledger.runs import Budgets, Run
from ledger.steps import StepStore
from ledger.vocabulary import Role
from tasks.executor import ExecutorConfig, StepMessage, execute_step
from tasks.workflow import Registry
from tests.support import reads
from tests.support.driver import Driver, driver_fixture
from tests.workflows_budgets import (
    COST_PER_CALL,
    MODEL,
    READS,
    SLOW_IN_TIME,
    SLOW_OVERRUN,
    TOKENS_PER_CALL,
)

MODULES = ["tests.workflows_budgets"]

# The same scenario under a token budget and under a money budget: each call bills 60
# tokens and $0.60, so a limit of "n calls and two thirds" is 100 tokens or $1.00, etc.
KINDS = ["tokens", "cost_usd"]


def _budget(kind: str, calls: float) -> Budgets:
    if kind == "tokens":
        return Budgets(tokens=round(calls * TOKENS_PER_CALL))
    return Budgets(cost_usd=round(calls * COST_PER_CALL, 2))


def _spent(run: Run, kind: str) -> float:
    return run.used_tokens if kind == "tokens" else float(run.used_cost_usd)


def _per_call(kind: str) -> float:
    return TOKENS_PER_CALL if kind == "tokens" else COST_PER_CALL


drv = driver_fixture(MODULES)


def _paid(run_the_test: Any) -> tuple[Run, int]:
    before = MODEL.paid_here
    run = run_the_test()
    return run, MODEL.paid_here - before


@pytest.mark.parametrize("kind", KINDS)
def test_budget__a_step_stops_once_its_budget_is_spent(ledger: Ledger, drv: Driver,
                                                       kind: str) -> None:
    """Invariant: what was paid is spent. Without any crash or error (the reference for the
    tests below), a step that calls the model until stopped, with a budget of 1 2/3 calls,
    makes 2 calls (the second starts under budget) and the run fails budget_exhausted with
    exactly those 2 calls debited (before, a step stopped by its budget debited nothing)."""
    run_id = ledger.start_run("test_spender", {}, budgets=_budget(kind, 5 / 3))
    run, paid = _paid(lambda: drv.drive(run_id))
    assert run.status is RunStatus.FAILED and run.last_error["reason"] == "budget_exhausted"
    assert paid == 2
    assert _spent(run, kind) == pytest.approx(2 * _per_call(kind))
    assert run.last_error["spent"][kind] == pytest.approx(_spent(run, kind))


@pytest.mark.parametrize("kind", KINDS)
def test_budget__answers_replayed_from_the_record_count_against_the_step(
        ledger: Ledger, drv: Driver, kind: str) -> None:
    """Invariant: a budget is never exceeded by more than one call's spend. A step pays for
    2 calls and raises; its retry gets those 2 answers from the record, and they count:
    with a budget of 2.5 calls it pays for 1 more call, not 3 more (5 in all)."""
    run_id = ledger.start_run("test_spender", {"raise_after": 2},
                              budgets=_budget(kind, 2.5))
    run, paid = _paid(lambda: drv.drive(run_id))
    assert run.status is RunStatus.FAILED and run.last_error["reason"] == "budget_exhausted"
    assert paid == 3
    assert _spent(run, kind) == pytest.approx(3 * _per_call(kind))
    assert _spent(run, kind) <= 2.5 * _per_call(kind) + _per_call(kind)


@pytest.mark.parametrize("kind", KINDS)
def test_budget__a_failed_steps_spend_is_debited(ledger: Ledger, drv: Driver,
                                                 kind: str) -> None:
    """Invariant: what was paid is spent. A step pays for one call and then fails the run
    (a non-retryable error): the run shows that call's tokens and cost, not 0."""
    run_id = ledger.start_run("test_spender", {"give_up_after": 1},
                              budgets=_budget(kind, 10))
    run, paid = _paid(lambda: drv.drive(run_id))
    assert run.status is RunStatus.FAILED and "giving up" in run.last_error["message"]
    assert paid == 1
    assert (run.used_tokens, run.used_cost_usd) == (TOKENS_PER_CALL,
                                                    Decimal(str(COST_PER_CALL)))


def _drive_through_polls(ledger: Ledger, drv: Driver, run_id: UUID) -> Run:
    """Execute the run's deliveries, letting each status-poll delay pass at once."""
    for _ in range(20):
        run = ledger.get_run(run_id)
        assert run is not None
        if run.status is not RunStatus.RUNNING:
            return run
        reads.execute(ledger.engine, "UPDATE onward.outbox SET due_at = onward.now() "
                      "WHERE run_id = :id", id=run_id)
        drv.step(run_id, run.seq)
    raise AssertionError(f"run {run_id} still running: {ledger.get_run(run_id)}")


def test_budget__status_polls_of_an_accepted_effect_spend_no_attempt_budget(
        ledger: Ledger, drv: Driver) -> None:
    """Invariant: the attempt budget counts step executions. A step whose effect the
    provider accepted and completes after 5 status polls, with an attempt budget of 2:
    each poll gives the lease back and is not counted; the run completes with one attempt
    spent (today the polls spend it and the run fails with the effect still accepted)."""
    run_id = ledger.start_run("test_polled_job", {}, budgets=Budgets(attempts=2))
    run = _drive_through_polls(ledger, drv, run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    assert run.result is not None and run.result["polls"] == 5
    assert run.attempts_total == 1
    polls = [a for a in reads.attempts(ledger.engine, run_id) if a["outcome"] == "waiting"]
    assert len(polls) == 5  # the accepted call, then 4 polls that still found it accepted
    assert [e.status.value for e in ledger.effects(run_id)] == ["completed"]


def test_budget__inherited_budgets_of_a_replay_of_a_replay_keep_the_grandparents_spend(
        ledger: Ledger, drv: Driver) -> None:
    """Invariant: a replay with inherited budgets starts with what its whole history had
    spent at the checkpoint it copies. Original run: three steps, one paid call each.
    A live replay from checkpoint 1 inherits the first call; a replay of that replay from
    its checkpoint 2 inherits the first call (the grandparent's) and the second (the
    parent's): 2 calls, 2 step executions, not 1."""
    ops = ledger.acting_as("olga", Role.OPERATOR)
    original = drv.drive(ledger.start_run("test_three_calls", {},
                                          budgets=Budgets(tokens=1000, cost_usd=100)))
    assert (original.status, original.used_tokens) == (RunStatus.COMPLETED,
                                                       3 * TOKENS_PER_CALL)
    replay = drv.drive(ops.replay(original.id, 1, "live", "again from the second").run_id)
    assert replay.status is RunStatus.COMPLETED
    assert (replay.used_tokens, replay.attempts_total) == (3 * TOKENS_PER_CALL, 3)
    again = ops.replay(replay.id, 2, "live", "again from the third").run_id
    started = ledger.get_run(again)
    assert started is not None
    assert started.used_tokens == 2 * TOKENS_PER_CALL
    assert started.used_cost_usd == Decimal(str(2 * COST_PER_CALL))
    assert started.attempts_total == 2


# -- model calls slower than the lease (review F21) ------------------------------------------
def _first_lease_ran_out(ledger: Ledger, run_id: UUID, worker: str, ttl_s: float) -> bool:
    """Whether, by the ledger's clock, the lease ``worker`` took when it claimed the run's
    step (``ttl_s`` long) would have expired, had nothing extended it."""
    with ledger.engine.connect() as conn:
        return bool(conn.execute(sa.text(
            "SELECT onward.now() > started_at + :ttl * interval '1 second' "
            "FROM onward.step_attempts WHERE run_id = :run_id AND worker = :worker"),
            {"ttl": ttl_s, "run_id": run_id, "worker": worker}).scalar())


def _race(ledger: Ledger, run_id: UUID, workers: int) -> dict[str, str]:
    """``workers`` workers (threads with their own connections, a 1 s lease) each try the
    run's first step, one after another: each comes once the previous one is done or the
    lease it claimed would have expired (what the reaper's re-queue does with the default
    30 s lease and a 60-120 s reasoning-model call). Returns each worker's report."""
    registry = Registry()
    registry.load_modules(MODULES)
    config = ExecutorConfig(keys=ledger.keys, max_state_bytes=1_000_000, retry_base_s=0.0,
                            retry_max_s=0.0, tool_lease_margin_s=0.5)
    stores = [StepStore(ledger.url, ledger.keys, lease_ttl_s=1.0) for _ in range(workers)]
    reports: dict[str, str] = {}

    def work(name: str, store: StepStore) -> None:
        reports[name] = execute_step(store, registry, config, StepMessage(run_id=run_id, seq=0),
                                     worker=name, publish=lambda *a: None).kind.value

    threads = [threading.Thread(target=work, args=(f"w{i}", s)) for i, s in enumerate(stores)]
    try:
        for i, thread in enumerate(threads):
            thread.start()

            def came_and_went(worker: str = f"w{i}", thread: threading.Thread = thread) -> bool:
                return not thread.is_alive() or _first_lease_ran_out(ledger, run_id, worker, 1.0)

            wait_for(came_and_went, timeout=30, what=f"w{i} to finish or outlive its first lease")
        for thread in threads:
            thread.join(timeout=60)
    finally:
        for store in stores:
            store.close()
    return reports


def test_slow_model_call__the_lease_covers_it_so_it_is_paid_once(ledger: Ledger) -> None:
    """Invariant (design 13.4 and 13.8; review F21): a model call is covered by the lease
    like a provider call: before it starts, the lease is extended over the client's time
    limit (``timeout_s``), in one statement fenced on the live lease. A call slower than
    the lease TTL but within its limit is not taken over: one call, paid and debited once,
    against a budget of 15 tokens."""
    SLOW_IN_TIME.paid = 0
    run_id = ledger.start_run("test_think_in_time", {}, budgets=Budgets(tokens=15))
    reports = _race(ledger, run_id, workers=3)
    run = ledger.get_run(run_id)
    assert SLOW_IN_TIME.paid == 1, (reports, run.status)
    assert sorted(reports.values()) == ["committed", "stale", "stale"]
    assert (run.status, run.used_tokens) == (RunStatus.COMPLETED, 10)


def test_slow_model_call__an_answer_after_the_lease_was_lost_is_still_debited(
        ledger: Ledger) -> None:
    """Invariant (design 13.8: what was paid is spent; review F21): a client that overruns
    its own time limit loses the lease during the call, and the next holder calls again;
    the first answer, arriving after its lease was lost, is not used (lease_lost) but its
    spend is debited. The ledger counts every call the model billed (20 tokens for 2)."""
    SLOW_OVERRUN.paid = 0
    run_id = ledger.start_run("test_think_overrun", {}, budgets=Budgets(tokens=15))
    reports = _race(ledger, run_id, workers=2)
    run = ledger.get_run(run_id)
    assert SLOW_OVERRUN.paid == 2, reports
    assert sorted(reports.values()) == ["committed", "lease_lost"]
    assert run.status is RunStatus.COMPLETED
    assert run.used_tokens == 10 * SLOW_OVERRUN.paid


def test_slow_read__the_lease_covers_it_so_it_is_made_once(ledger: Ledger) -> None:
    """Invariant (review F21, reads): a read slower than the lease TTL, within its tool's
    ``timeout_s``, is covered by the lease like any provider call: not taken over, made
    once, its answer recorded once."""
    READS["calls"] = 0
    run_id = ledger.start_run("test_read_slowly", {})
    reports = _race(ledger, run_id, workers=3)
    assert READS["calls"] == 1, reports
    run = ledger.get_run(run_id)
    assert (run.status, run.result) == (RunStatus.COMPLETED, {"answer": "42"})
