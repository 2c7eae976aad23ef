"""The executor's decision table (docs/design.md section 4): every way a claimed step can end,
driven through ``execute_step`` against an in-memory ledger (tests/support/stub_ledger.py)
behind the ``StepLedger`` protocol. No database: the stub fails a test that reaches one.

Each test reads as Given (the run and its step) / If (what the step or the ledger does) /
Expect (the report, the statements the executor ran, and where the run stands). A decision
a step takes on ``Control`` (a wait, a park, a stop, a divergence, a cancel) is recorded the
way ``ctx``'s calls record it, since the effect and evidence protocol behind them is tested
against PostgreSQL in tests/integration.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from ledger.effects import Effect
from ledger.exceptions import EffectConflict, StatementRefused
from ledger.lineage import Divergence
from ledger.steps import StepStore
from ledger.vocabulary import EffectStatus, FailReason, ParkReason, RunStatus
from tasks import Registry, StepContext, Workflow
from tasks.control import CancelFor, DivergeFor, FailFor, Suspend, WaitFor
from tasks.exceptions import LeaseLost, StepError
from tasks.executor import ExecutorConfig, ReportKind, StepMessage, StepReport, execute_step
from tasks.step_ledger import StepLedger
from tests.support.stub_ledger import KEYS, StubEffects, StubEvidence, StubLedger, StubRun

CONFIG = ExecutorConfig(keys=KEYS, max_state_bytes=10_000, retry_base_s=0.0, retry_max_s=0.0)
Body = Callable[[StepContext, Any], Any]


class State(BaseModel):
    n: int = 0


def workflow(body: Body, *, version: int = 1, steps: tuple[str, ...] = ("second",),
             name: str = "table") -> Workflow[State]:
    """A workflow whose start step ``first`` runs ``body``; the other steps finish."""
    flow = Workflow(name, state=State, version=version)
    flow.step(start=True, name="first")(body)
    for other in steps:
        flow.step(name=other)(lambda ctx, state: ctx.finish(n=state.n))
    return flow


@dataclass
class Table:
    """One run on the stub ledger and the code that executes its steps."""

    ledger: StubLedger
    registry: Registry
    run_id: UUID
    effects: StubEffects = field(default_factory=StubEffects)
    published: list[tuple[UUID, int, str]] = field(default_factory=list)
    config: ExecutorConfig = CONFIG

    @property
    def run(self) -> StubRun:
        return self.ledger.runs[self.run_id]

    def step(self, seq: int = 0, *, registry: Registry | None = None) -> StepReport:
        return execute_step(self.ledger, registry or self.registry, self.config,
                            StepMessage(run_id=self.run_id, seq=seq), worker="unit:0",
                            publish=lambda *message: self.published.append(message),
                            effects=self.effects, evidence=StubEvidence())


def given(body: Body, *, max_attempts: int = 3, **start: Any) -> Table:
    registry = Registry()
    registry.register(workflow(body))
    ledger = StubLedger()
    run_id = ledger.start("table", {"n": 0}, max_attempts=max_attempts, **start)
    return Table(ledger, registry, run_id)


def decide(record: Callable[[StepContext], None]) -> Body:
    """A step body that records a decision on ``Control`` and is suspended, as ``ctx``'s
    calls do."""
    def body(ctx: StepContext, state: State) -> Any:
        record(ctx)
        raise Suspend()
    return body


def raises(exc: BaseException) -> Body:
    def body(ctx: StepContext, state: State) -> Any:
        raise exc
    return body


# -- commits -----------------------------------------------------------------------------
def test_decision__goto_commits_and_publishes_the_next_step() -> None:
    """Given a step that goes on; expect one claim, one commit, the next message published."""
    table = given(lambda ctx, state: ctx.goto("second", n=state.n + 1))
    report = table.step()
    assert (report.kind, report.status, report.next_seq, report.next_step) == (
        ReportKind.COMMITTED, "running", 1, "second")
    assert table.ledger.statements == ["claim", "commit"]
    assert table.published == [(table.run_id, 1, report.queue)]
    assert (table.run.seq, table.run.step, table.run.head.state) == (1, "second", {"n": 1})


def test_decision__the_next_step_restores_what_the_commit_signed() -> None:
    """Given a committed goto; expect the next step to restore that checkpoint and finish."""
    table = given(lambda ctx, state: ctx.goto("second", n=7))
    table.step()
    report = table.step(1)
    assert (report.kind, report.status) == (ReportKind.COMMITTED, "completed")
    assert table.run.result == {"n": 7}


@pytest.mark.parametrize(("body", "status", "published"), [
    (lambda ctx, state: ctx.finish(answer=42), RunStatus.COMPLETED, False),
    (lambda ctx, state: ctx.fail("on_purpose", why="test"), RunStatus.FAILED, False),
    (lambda ctx, state: ctx.ask_approval("send", artifact={"x": 1}, then="second"),
     RunStatus.WAITING, False),
    (lambda ctx, state: ctx.wait_for_signal("go", then="second"), RunStatus.WAITING, False),
    (lambda ctx, state: ctx.sleep(timedelta(minutes=5), then="second"), RunStatus.RUNNING,
     False),
], ids=["finish", "fail", "wait_approval", "wait_signal", "timer"])
def test_decision__an_outcome_commits_once_and_publishes_nothing_more(
        body: Body, status: RunStatus, published: bool) -> None:
    """Given a step that ends the run, waits for a person or a signal, or sleeps; expect one
    commit and no message now (a timer's message is the outbox row due later)."""
    table = given(body)
    report = table.step()
    assert (report.kind, report.status, report.next_seq) == (
        ReportKind.COMMITTED, status.value, None)
    assert table.ledger.statements == ["claim", "commit"]
    assert bool(table.published) is published
    assert table.run.status is status


def test_decision__a_failed_run_keeps_its_reason_in_the_result() -> None:
    table = given(lambda ctx, state: ctx.fail("on_purpose", why="test"))
    table.step()
    assert table.run.result == {"failed": {"reason": "on_purpose", "why": "test"}}


# -- errors: retry or fail -----------------------------------------------------------------
def test_decision__an_error_with_attempts_left_retries() -> None:
    """Given a step that raises with attempts left; expect RETRY, the error recorded."""
    table = given(raises(ValueError("flaky")))
    report = table.step()
    assert (report.kind, report.detail) == (ReportKind.RETRY, "flaky")
    assert table.ledger.statements == ["claim", "fail"]
    assert table.run.status is RunStatus.RUNNING
    assert table.run.last_error is not None
    assert (table.run.last_error["type"], table.run.last_error["attempt"]) == ("ValueError", 1)


def test_decision__an_error_on_the_last_attempt_fails_the_run() -> None:
    table = given(raises(ValueError("again")), max_attempts=1)
    report = table.step()
    assert report.kind is ReportKind.FAILED
    assert table.ledger.statements == ["claim", "fail_run"]
    assert table.run.status is RunStatus.FAILED


def test_decision__a_non_retryable_error_fails_the_run_at_once() -> None:
    table = given(raises(StepError("bad input", non_retryable=True)))
    report = table.step()
    assert report.kind is ReportKind.FAILED
    assert table.ledger.statements == ["claim", "fail_run"]


@pytest.mark.parametrize(("body", "why"), [
    (lambda ctx, state: 42, "returned int"),
    (lambda ctx, state: ctx.goto("nowhere"), "unknown step 'nowhere'"),
    (lambda ctx, state: ctx.goto("second", missing=1), "does not have"),
    (lambda ctx, state: ctx.goto("second", n="not a number"), "invalid"),
    (lambda ctx, state: ctx.finish(blob="x" * 20_000), "over the limit"),
], ids=["not_an_outcome", "unknown_step", "unknown_field", "invalid_state", "too_large"])
def test_decision__an_outcome_the_ledger_cannot_take_is_a_step_error(body: Body,
                                                                       why: str) -> None:
    """Given an outcome that names no step, an unknown or invalid field, or is too large;
    expect the run failed with the reason (the code is wrong: no retry), nothing committed."""
    table = given(body)
    report = table.step()
    assert report.kind is ReportKind.FAILED
    assert why in report.detail
    assert table.ledger.statements == ["claim", "fail_run"]
    assert table.run.seq == 0


def test_decision__a_commit_the_ledger_refuses_is_a_step_error() -> None:
    """If the commit statement refuses (nothing written); expect the run failed with the
    ledger's reason, not a crash."""
    table = given(lambda ctx, state: ctx.goto("second"))

    def refuse(*args: Any, **kwargs: Any) -> bool:
        table.ledger.statements.append("commit")
        raise StatementRefused("refused for the test")

    table.ledger.commit = refuse
    report = table.step()
    assert report.kind is ReportKind.FAILED
    assert "the ledger refused to commit step first" in report.detail
    assert table.ledger.statements == ["claim", "commit", "fail_run"]


# -- decisions the step took on Control ------------------------------------------------------
def test_decision__an_accepted_effect_defers_the_step() -> None:
    """Given a step whose effect was accepted (polled later); expect WAITING via one defer."""
    table = given(decide(lambda ctx: ctx.services.control.wait(
        WaitFor(2.0, "effect:abc", "accepted; polling"))))
    report = table.step()
    assert (report.kind, report.detail) == (ReportKind.WAITING, "accepted; polling")
    assert table.ledger.statements == ["claim", "defer"]


def test_decision__a_park_decided_in_the_step_parks_the_run() -> None:
    table = given(decide(lambda ctx: ctx.services.control.park(
        ParkReason.EFFECT_CONFLICT, EffectConflict("another payload"))))
    report = table.step()
    assert report.kind is ReportKind.PARKED
    assert table.ledger.statements == ["claim", "park"]
    assert table.run.parked_reason is ParkReason.EFFECT_CONFLICT


def test_decision__a_park_stands_whatever_the_body_caught_and_returned() -> None:
    """If the body catches the error that parked the run and goes on; expect it parked
    anyway, nothing committed."""
    def swallow(ctx: StepContext, state: State) -> Any:
        ctx.services.control.park(ParkReason.INTEGRITY, EffectConflict("edited"))
        return ctx.goto("second")

    table = given(swallow)
    assert table.step().kind is ReportKind.PARKED
    assert "commit" not in table.ledger.statements


def test_decision__a_stop_decided_in_the_step_fails_the_run_with_its_reason() -> None:
    table = given(decide(lambda ctx: ctx.services.control.fail(
        FailFor(FailReason.BUDGET_EXHAUSTED, "token budget spent", {"tokens": 9}))))
    report = table.step()
    assert report.kind is ReportKind.FAILED
    assert table.ledger.statements == ["claim", "fail_run"]
    assert table.run.last_error is not None
    assert table.run.last_error["reason"] == FailReason.BUDGET_EXHAUSTED


def test_decision__a_divergence_stops_the_replay() -> None:
    divergence = Divergence("llm", "no_record", "first", 0, "first@0#1", "parent never asked")
    table = given(decide(lambda ctx: ctx.services.control.diverge(
        DivergeFor(divergence, {"message": divergence.message}))))
    report = table.step()
    assert (report.kind, report.detail) == (ReportKind.DIVERGED, "parent never asked")
    assert table.ledger.statements == ["claim", "diverge"]
    assert table.run.status is RunStatus.DIVERGED


def test_decision__a_cancel_seen_in_the_step_cancels_the_run() -> None:
    table = given(decide(lambda ctx: ctx.services.control.cancel(CancelFor("operator"))))
    report = table.step()
    assert report.kind is ReportKind.CANCELLED
    assert table.ledger.statements == ["claim", "end_cancelled"]


# -- cancel requests -----------------------------------------------------------------------
def test_decision__a_cancel_requested_before_the_claim_runs_nothing() -> None:
    ran: list[int] = []
    table = given(lambda ctx, state: ran.append(1) or ctx.finish())
    table.run.cancel_requested = {"message": "stop it"}
    report = table.step()
    assert (report.kind, report.detail) == (ReportKind.CANCELLED, "stop it")
    assert table.ledger.statements == ["claim", "end_cancelled"]
    assert ran == []


def test_decision__a_cancel_found_by_the_heartbeat_cancels_the_run() -> None:
    def long_step(ctx: StepContext, state: State) -> Any:
        ctx.heartbeat()
        return ctx.goto("second")

    table = given(long_step)
    table.ledger.cancel_on.add("heartbeat")
    assert table.step().kind is ReportKind.CANCELLED
    assert table.ledger.statements == ["claim", "heartbeat", "end_cancelled"]


def test_decision__a_cancel_found_by_the_commit_cancels_the_run() -> None:
    table = given(lambda ctx, state: ctx.goto("second"))
    table.ledger.cancel_on.add("commit")
    assert table.step().kind is ReportKind.CANCELLED
    assert table.ledger.statements == ["claim", "commit", "end_cancelled"]


# -- the lease -------------------------------------------------------------------------------
@pytest.mark.parametrize(("body", "lost", "statements"), [
    (lambda ctx, state: ctx.goto("second"), "commit", ["claim", "commit"]),
    (raises(ValueError("x")), "fail", ["claim", "fail"]),
    (raises(ValueError("x")), "fail_run", ["claim", "fail_run"]),
    (decide(lambda ctx: ctx.services.control.wait(WaitFor(1.0, "effect:e", "d"))), "defer",
     ["claim", "defer"]),
    (decide(lambda ctx: ctx.services.control.park(ParkReason.INTEGRITY, ValueError("e"))),
     "park", ["claim", "park"]),
], ids=["commit", "retry", "fail_run", "defer", "park"])
def test_decision__a_statement_that_finds_the_lease_lost_writes_nothing(
        body: Body, lost: str, statements: list[str]) -> None:
    """If the fenced statement finds the lease taken over; expect LEASE_LOST and the run
    where it was."""
    table = given(body, max_attempts=1 if lost == "fail_run" else 3)
    table.ledger.lose.add(lost)
    report = table.step()
    assert report.kind is ReportKind.LEASE_LOST
    assert table.ledger.statements == statements
    assert (table.run.seq, table.run.status) == (0, RunStatus.RUNNING)
    assert table.published == []


def test_decision__a_lease_lost_during_the_step_discards_its_result() -> None:
    def long_step(ctx: StepContext, state: State) -> Any:
        ctx.heartbeat()
        return ctx.goto("second")

    table = given(long_step)
    table.ledger.lose.add("heartbeat")
    assert table.step().kind is ReportKind.LEASE_LOST
    assert table.ledger.statements == ["claim", "heartbeat", "commit_refused"]


def test_decision__a_fenced_error_raised_by_the_step_is_a_lost_lease() -> None:
    table = given(raises(LeaseLost("taken over")))
    assert table.step().kind is ReportKind.LEASE_LOST
    assert table.ledger.statements == ["claim", "commit_refused"]


def test_decision__a_delivery_for_a_seq_the_run_left_is_stale() -> None:
    """Given a run that moved past seq 0; if seq 0 is delivered again, expect STALE and
    nothing run."""
    table = given(lambda ctx, state: ctx.goto("second"))
    table.step()
    report = table.step(0)
    assert report.kind is ReportKind.STALE
    assert table.ledger.statements == ["claim", "commit", "claim"]


# -- restore and re-check refuse before any code runs ----------------------------------------
def test_decision__an_edited_checkpoint_parks_the_run_for_review() -> None:
    ran: list[int] = []
    table = given(lambda ctx, state: ran.append(1) or ctx.finish())
    table.ledger.edit_head(table.run_id, state={"n": 1000})
    report = table.step()
    assert report.kind is ReportKind.PARKED
    assert "does not match its MAC" in report.detail
    assert table.ledger.statements == ["claim", "park"]
    assert table.run.parked_reason is ParkReason.INTEGRITY
    assert ran == []


def test_decision__a_step_the_code_no_longer_has_parks_the_run() -> None:
    table = given(lambda ctx, state: ctx.goto("second"))
    table.step()
    without = Registry()
    without.register(workflow(lambda ctx, state: ctx.finish(), steps=()))
    report = table.step(1, registry=without)
    assert report.kind is ReportKind.PARKED
    assert table.run.parked_reason is ParkReason.UNKNOWN_STEP


def test_decision__a_workflow_this_worker_lacks_is_handed_back_then_parked() -> None:
    """Given a run of a workflow this worker does not have (its own workers down for a
    deploy); expect a hand-back, as for a version it lacks (no attempt spent, the run
    unchanged), and once hand-backs reach the limit, the run parked no_worker_for_version
    naming the workflow."""
    table = given(lambda ctx, state: ctx.finish())
    other = Registry()
    other.register(workflow(lambda ctx, state: ctx.finish(), name="other"))
    report = table.step(registry=other)
    assert report.kind is ReportKind.RELEASED
    assert table.ledger.statements == ["claim", "hand_back"]
    assert (table.run.seq, table.run.status) == (0, RunStatus.RUNNING)
    assert (table.run.handbacks, table.run.attempt) == (1, 0)
    table.run.handbacks = CONFIG.handback_limit - 1
    last = table.step(registry=other)
    assert last.kind is ReportKind.PARKED
    assert table.run.parked_reason is ParkReason.NO_WORKER_FOR_VERSION
    assert "no worker with workflow " in last.detail and "ONWARD_WORKFLOWS" in last.detail


def test_decision__a_newer_version_is_handed_back_then_parked_after_the_limit() -> None:
    """Given a run bound to v2 and a worker with v1 only; expect a hand-back (no attempt
    spent), and once hand-backs reach the limit, the run parked no_worker_for_version."""
    table = given(lambda ctx, state: ctx.finish(), workflow_version=2)
    first = table.step()
    assert first.kind is ReportKind.RELEASED
    assert table.ledger.statements == ["claim", "hand_back"]
    assert (table.run.handbacks, table.run.attempt) == (1, 0)
    table.run.handbacks = CONFIG.handback_limit - 1
    last = table.step()
    assert last.kind is ReportKind.PARKED
    assert table.run.parked_reason is ParkReason.NO_WORKER_FOR_VERSION


def test_decision__a_run_past_its_deadline_fails_before_its_step_runs() -> None:
    ran: list[int] = []
    table = given(lambda ctx, state: ran.append(1) or ctx.finish(),
                  deadline_at=datetime.now(UTC) - timedelta(seconds=1))
    report = table.step()
    assert report.kind is ReportKind.FAILED
    assert table.run.last_error is not None
    assert table.run.last_error["reason"] == FailReason.DEADLINE_EXCEEDED
    assert table.ledger.statements == ["claim", "fail_run"]
    assert ran == []


# -- a run never ends past an effect whose outcome is unknown ---------------------------------
def _unknown_effect(run_id: UUID) -> Effect:
    now = datetime.now(UTC)
    return Effect(effect_id="e" * 64, effect_type="pay", run_id=run_id, seq=0, step="first",
                  command_id="first@0#1", tool_class="idempotent", request_hash="h" * 64,
                  recipient=None, payload=None, status=EffectStatus.PENDING, provider_ref=None,
                  result=None, error=None, reconciled=False, attempts=1, polls=0,
                  created_at=now, updated_at=now, completed_at=None, call_unknown=True)


@pytest.mark.parametrize("ending", ["fail", "cancel"])
def test_decision__an_unknown_outcome_parks_the_run_instead_of_ending_it(ending: str) -> None:
    """Given an effect whose outcome stays unknown (no tool to ask); if the run was to fail
    or be cancelled, expect it parked effect_outcome_unknown and never ended."""
    body = (raises(StepError("give up", non_retryable=True)) if ending == "fail"
            else decide(lambda ctx: ctx.services.control.cancel(CancelFor("operator"))))
    table = given(body)
    table.effects.unknown.append(_unknown_effect(table.run_id))
    report = table.step()
    assert report.kind is ReportKind.PARKED
    assert table.ledger.statements == ["claim", "park"]
    assert table.run.parked_reason is ParkReason.EFFECT_OUTCOME_UNKNOWN


# -- the seam ---------------------------------------------------------------------------------
def _statements(cls: type) -> dict[str, list[tuple[str, Any]]]:
    return {name: [(p.name, p.kind) for p in inspect.signature(member).parameters.values()]
            for name, member in vars(cls).items()
            if callable(member) and not name.startswith("_")}


@pytest.mark.parametrize("ledger", [StepStore, StubLedger], ids=["StepStore", "StubLedger"])
def test_step_ledger__the_real_store_and_the_stub_take_every_statement_alike(
        ledger: type) -> None:
    """The stub stands for the real store only while both take the protocol's statements
    with the same parameters."""
    wanted = _statements(StepLedger)
    have = _statements(ledger)
    assert {name: have.get(name) for name in wanted} == wanted
