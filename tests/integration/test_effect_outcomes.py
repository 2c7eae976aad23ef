"""Resolve, never abandon: every path that ends or refuses a run first learns the outcome of
its effects (docs/design.md section 13, invariant 2), against a real PostgreSQL with steps
executed in the test process (tests/support/driver.py). The provider is an in-process fake
(tests/workflows_outcomes.OUTSIDE) that counts the objects it holds."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus, operations
from ledger.effects import EffectStore, Intent
from ledger.exceptions import EffectFenced, InvalidInput, OperationRefused, PermissionDenied
from ledger.recovery import RecoveryStore
from ledger.runs import Budgets
from ledger.steps import Claim, StepStore
from ledger.vocabulary import EffectAttemptKind, EffectStatus, Role
from tasks.executor import ReportKind
from tests.support import clock
from tests.support.cluster import wait_for
from tests.support.driver import Driver, driver
from tests.workflows_outcomes import OUTSIDE

MODULES = ["tests.workflows_outcomes"]


@pytest.fixture()
def ops(ledger: Ledger) -> Ledger:
    return ledger.acting_as("olga", Role.OPERATOR)


@pytest.fixture()
def drv(ops: Ledger) -> Iterator[Driver]:
    OUTSIDE.reset()
    with driver(ops, MODULES) as running:
        yield running
    OUTSIDE.reset()


def lost_first_answer(drv: Driver, tool: str = "lookup", **start: Any) -> UUID:
    """Start a run whose first call acts at the provider and loses its answer: after one
    step execution the effect is pending with an attempt of unknown outcome."""
    OUTSIDE.lose_answers = 1
    run_id = drv.ledger.start_run("test_outcome_send", {"tool": tool}, **start)
    drv.step(run_id, 0)
    [effect] = drv.ledger.effects(run_id)
    assert (effect.status, OUTSIDE.count()) == (EffectStatus.PENDING, 1)
    return run_id


def one_effect(ledger: Ledger, run_id: UUID) -> Any:
    [effect] = ledger.effects(run_id)
    return effect


def past_deadline(ledger: Ledger, run_id: UUID) -> bool:
    with ledger.engine.connect() as conn:
        return bool(conn.execute(sa.text(
            "SELECT onward.now() > deadline_at FROM onward.runs WHERE id = :id"),
            {"id": run_id}).scalar())


def test_attempt_budget__found_effect_is_recorded_then_the_run_fails(drv: Driver) -> None:
    """Invariant: a run refused by its attempt budget while an effect's answer was lost
    first asks the provider: the object it holds is recorded ``completed`` (not closed as
    failed) and only then does the run fail; one object."""
    run_id = lost_first_answer(drv, budgets=Budgets(attempts=1))
    run = drv.drive(run_id)
    assert (run.status, run.last_error["reason"]) == (RunStatus.FAILED, "budget_exhausted")
    effect = one_effect(drv.ledger, run_id)
    assert (effect.status, effect.reconciled) == (EffectStatus.COMPLETED, True)
    assert OUTSIDE.count() == 1


def test_attempt_budget__without_lookup_the_run_parks(drv: Driver) -> None:
    """Invariant: when the tool cannot be asked, the refused run is parked
    ``effect_outcome_unknown`` and its effect stays ``pending`` (never ``failed``)."""
    run_id = lost_first_answer(drv, "blind", budgets=Budgets(attempts=1))
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "effect_outcome_unknown")
    assert "budget" in run.last_error["message"]
    assert one_effect(drv.ledger, run_id).status is EffectStatus.PENDING
    assert OUTSIDE.count() == 1


def test_later_refusal__never_closes_an_earlier_unknown_call(drv: Driver) -> None:
    """Invariant (design 13.2; review F13): a call whose answer was lost may have landed,
    and a later attempt's stated refusal (a 503: nothing happened *that* time) says nothing
    about it. When the attempts run out the run is parked ``effect_outcome_unknown`` with
    its effect still ``pending``, never failed nor closed ``unsent``."""
    OUTSIDE.lose_answers, OUTSIDE.refuse = 1, 5
    run_id = drv.ledger.start_run("test_outcome_send", {"tool": "keyed"})
    run = drv.drive(run_id)
    effect = one_effect(drv.ledger, run_id)
    outcomes = [a.outcome for a in drv.ledger.effect_attempts(effect)]
    assert outcomes == ["unknown", "failed", "failed"]  # three step attempts, two refusals
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "effect_outcome_unknown")
    assert effect.status is EffectStatus.PENDING
    assert OUTSIDE.count() == 1


def test_later_refusal__a_lookup_that_found_nothing_first_lets_the_run_fail_unsent(
        drv: Driver) -> None:
    """Invariant: a refusal *after* a lookup that found nothing leaves nothing that can have
    landed: the run fails and the effect is closed ``unsent`` (continue sends it once)."""
    OUTSIDE.lose_answers, OUTSIDE.refuse = 1, 0
    run_id = drv.ledger.start_run("test_outcome_send", {"tool": "lookup"})
    drv.step(run_id, 0)  # acted, answer lost
    OUTSIDE.objects.clear()  # the provider dropped the object: the lookup finds nothing
    OUTSIDE.refuse = 5
    run = drv.drive(run_id)
    effect = one_effect(drv.ledger, run_id)
    kinds = [(a.kind, a.outcome) for a in drv.ledger.effect_attempts(effect)]
    assert kinds[:3] == [("call", "unknown"), ("lookup", "missing"), ("call", "failed")]
    assert run.status is RunStatus.FAILED
    assert effect.status is EffectStatus.UNSENT


def test_cancel__a_later_refusal_does_not_let_cancel_close_an_unknown_call(
        drv: Driver, ops: Ledger) -> None:
    """Invariant (review F13, cancel path): a run between retries whose first call lost its
    answer and whose second was refused still has an effect of unknown outcome: cancel
    asks a worker to resolve it (here: no lookup, so the run parks) instead of closing it
    ``unsent`` at once."""
    OUTSIDE.lose_answers, OUTSIDE.refuse = 1, 1
    run_id = drv.ledger.start_run("test_outcome_send", {"tool": "keyed"})
    drv.step(run_id, 0)
    drv.step(run_id, 0)
    assert [a.outcome for a in ops.effect_attempts(one_effect(ops, run_id))] == [
        "unknown", "failed"]
    cancelled = ops.cancel(run_id, "customer withdrew")
    assert cancelled.requested is True
    assert one_effect(ops, run_id).status is EffectStatus.PENDING
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "effect_outcome_unknown")
    assert one_effect(ops, run_id).status is EffectStatus.PENDING
    assert OUTSIDE.count() == 1


def test_deadline__reaper_does_not_fail_a_run_whose_unknown_call_was_followed_by_a_refusal(
        drv: Driver) -> None:
    """Invariant (review F13, the reaper's deadline path): an unknown call followed by a
    refused one still blocks the reaper from failing the run: it queues it, and the worker
    (no lookup) parks it; the effect is never closed ``unsent``."""
    OUTSIDE.lose_answers, OUTSIDE.refuse = 1, 1
    # both attempts must run before the deadline (2 s: 300 ms passed mid-way on a loaded
    # machine, and the second claim then took the worker's deadline path instead)
    run_id = drv.ledger.start_run("test_outcome_send", {"tool": "keyed"},
                                  budgets=Budgets(deadline=timedelta(seconds=2)))
    drv.step(run_id, 0)
    drv.step(run_id, 0)
    wait_for(lambda: past_deadline(drv.ledger, run_id), timeout=10, what="the deadline")
    RecoveryStore(drv.ledger.engine).sweep(stall_after_s=60)
    assert drv.ledger.get_run(run_id).status is RunStatus.RUNNING
    assert one_effect(drv.ledger, run_id).status is EffectStatus.PENDING
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "effect_outcome_unknown")
    assert OUTSIDE.count() == 1


def test_token_budget__refusal_mid_step_resolves_a_swallowed_unknown_outcome(
        drv: Driver) -> None:
    """Invariant: a token budget that stops a step after its body swallowed an unknown
    outcome does not close that effect as failed: it is looked up and recorded."""
    OUTSIDE.lose_answers = 1
    run_id = drv.ledger.start_run("test_outcome_chatty", {}, budgets=Budgets(tokens=5))
    run = drv.drive(run_id)
    assert (run.status, run.last_error["reason"]) == (RunStatus.FAILED, "budget_exhausted")
    assert one_effect(drv.ledger, run_id).status is EffectStatus.COMPLETED
    assert OUTSIDE.count() == 1


def test_deadline__worker_recheck_resolves_before_failing(drv: Driver) -> None:
    """Invariant: a run past its deadline when a worker claims it resolves its effects
    before it fails ``deadline_exceeded``."""
    run_id = lost_first_answer(drv, budgets=Budgets(deadline=timedelta(milliseconds=300)))
    wait_for(lambda: past_deadline(drv.ledger, run_id), timeout=10, what="the deadline")
    run = drv.drive(run_id)
    assert (run.status, run.last_error["reason"]) == (RunStatus.FAILED, "deadline_exceeded")
    assert one_effect(drv.ledger, run_id).status is EffectStatus.COMPLETED
    assert OUTSIDE.count() == 1


def test_deadline__reaper_queues_a_run_with_an_unknown_effect_instead_of_failing_it(
        drv: Driver) -> None:
    """Invariant: the reaper, which has no tool code, never fails a run past its deadline
    while one of its effects has an unknown outcome: it queues the run now, and a worker
    reconciles the effect, then fails the run. No effect is left pending on an ended run."""
    run_id = lost_first_answer(drv, budgets=Budgets(deadline=timedelta(milliseconds=300)))
    wait_for(lambda: past_deadline(drv.ledger, run_id), timeout=10, what="the deadline")
    swept = RecoveryStore(drv.ledger.engine).sweep(stall_after_s=60)
    assert swept.waits.deadlines == 1
    assert drv.ledger.get_run(run_id).status is RunStatus.RUNNING
    with drv.ledger.engine.connect() as conn:
        queued = conn.execute(sa.text(
            "SELECT count(*) FROM onward.outbox WHERE run_id = :id AND due_at <= onward.now()"),
            {"id": run_id}).scalar_one()
    assert queued == 1
    run = drv.drive(run_id)
    assert (run.status, run.last_error["reason"]) == (RunStatus.FAILED, "deadline_exceeded")
    assert one_effect(drv.ledger, run_id).status is EffectStatus.COMPLETED


def approval_expired(ops: Ledger, approval_id: UUID) -> bool:
    with ops.engine.connect() as conn:
        return bool(conn.execute(sa.text(
            "SELECT onward.now() > expires_at FROM onward.approvals WHERE id = :id"),
            {"id": approval_id}).scalar())


def test_expired_approval__a_retry_of_a_step_that_started_in_time_goes_on(
        drv: Driver, ops: Ledger) -> None:
    """Invariant (the lead's decision on review F7): an approval authorises the approved
    step that *starts* before it expires. A retry after the expiry of a step whose first
    attempt began in time (and paid, losing the answer) is not refused: it looks the
    payment up, records it ``completed`` and the run completes with it. One object."""
    run_id = drv.ledger.start_run("test_outcome_approved_send", {})
    assert drv.drive(run_id).status is RunStatus.WAITING
    [asked] = ops.approvals(run_id=run_id)
    ops.approve(asked.id, artifact_hash=asked.artifact_hash)
    OUTSIDE.lose_answers = 1
    drv.step(run_id, 1)
    assert (one_effect(ops, run_id).status, OUTSIDE.count()) == (EffectStatus.PENDING, 1)
    wait_for(lambda: approval_expired(ops, asked.id), timeout=10,
             what="the approval to expire")
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    effect = one_effect(ops, run_id)
    assert (effect.status, effect.reconciled) == (EffectStatus.COMPLETED, True)
    assert run.result == {"sent": effect.provider_ref}
    assert OUTSIDE.count() == 1


def test_expired_approval__a_step_first_started_after_expiry_is_refused(
        drv: Driver, ops: Ledger) -> None:
    """Invariant: an approved step whose first attempt would start after the approval
    expired (by the database's clock) does not run: the run fails ``approval_expired``
    and nothing is sent."""
    run_id = drv.ledger.start_run("test_outcome_approved_send", {})
    assert drv.drive(run_id).status is RunStatus.WAITING
    [asked] = ops.approvals(run_id=run_id)
    ops.approve(asked.id, artifact_hash=asked.artifact_hash)
    wait_for(lambda: approval_expired(ops, asked.id), timeout=10,
             what="the approval to expire")
    run = drv.drive(run_id)
    assert (run.status, run.last_error["reason"]) == (RunStatus.FAILED, "approval_expired")
    assert ops.effects(run_id) == [] and OUTSIDE.count() == 0


def test_expired_approval__a_first_start_forged_in_step_attempts_does_not_run_the_step(
        drv: Driver, ops: Ledger) -> None:
    """Invariant: when the approved step's first attempt began is read from step_attempts,
    which nothing signs; a row inserted there with a start before the expiry (the step
    never ran: the worker was down until the approval expired) does not let the step begin
    after the expiry: with nothing signed recorded at its seq by an attempt in time, the run
    fails ``approval_expired`` and nothing is sent. Sent once before."""
    run_id = drv.ledger.start_run("test_outcome_approved_send", {})
    assert drv.drive(run_id).status is RunStatus.WAITING
    [asked] = ops.approvals(run_id=run_id)
    ops.approve(asked.id, artifact_hash=asked.artifact_hash)
    with ops.engine.begin() as conn:  # the attacker's first attempt, a second after the ask
        assert conn.execute(sa.text(
            "INSERT INTO onward.step_attempts (run_id, lease_epoch, seq, attempt, step, worker,"
            " started_at, ended_at, outcome) SELECT :r, 0, 1, 1, 'send_approved', 'mallory:1', "
            "created_at + interval '1 second', created_at + interval '2 seconds', 'failed' "
            "FROM onward.approvals WHERE id = :a"), {"r": run_id, "a": asked.id}).rowcount == 1
    wait_for(lambda: approval_expired(ops, asked.id), timeout=10,
             what="the approval to expire")

    run = drv.drive(run_id)

    assert run.status is RunStatus.FAILED, run
    assert run.last_error is not None and run.last_error["reason"] == "approval_expired"
    assert ops.effects(run_id) == [] and OUTSIDE.count() == 0


def test_failed_run__never_sent_effect_is_closed_unsent_and_sent_once_after_continue(
        drv: Driver) -> None:
    """Invariant: an effect whose every call was refused (nothing landed) is closed
    ``unsent`` by the statement that fails the run, and ``continue`` needs no reopening:
    the resumed step sends it with the same key, without a lookup; one object."""
    OUTSIDE.lose_answers = 0
    run_id = drv.ledger.start_run("test_outcome_send", {"tool": "blind"},
                                  budgets=Budgets(attempts=1))
    store = drv.store
    claim = store.claim(run_id, 0, "driver:0")
    assert isinstance(claim, Claim)
    effects = EffectStore(store.conn, drv.ledger.keys)
    effect, _ = effects.intend(Intent(
        effect_id="k" * 64, effect_type="test.outcome.without_lookup", run_id=run_id,
        tenant_id="default", seq=0, step="send", command_id="send@0#9",
        tool_class="irreversible", request_hash="h", recipient=None, payload={},
        lease_epoch=claim.epoch))
    attempt = effects.begin_attempt(effect, EffectAttemptKind.CALL, worker="driver:0",
                                    epoch=claim.epoch, cover_s=5)
    effects.record(effect, attempt, outcome="failed", status=EffectStatus.PENDING,
                   error={"message": "503"}, epoch=claim.epoch)
    assert store.fail(claim, "send", {"type": "StepError", "message": "x"}, retry_in_s=None)
    closed = {e.effect_id: e.status for e in drv.ledger.effects(run_id)}
    assert closed == {"k" * 64: EffectStatus.UNSENT}
    with drv.ledger.engine.begin() as conn:  # a person raises the budget, then continues
        conn.execute(sa.text("UPDATE onward.runs SET budget_attempts = 5 WHERE id = :id"),
                     {"id": run_id})
    drv.ledger.acting_as("olga", Role.OPERATOR).continue_run(run_id, "provider is back")
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    assert OUTSIDE.count() == 1


def test_record__a_stale_holders_late_answer_is_not_recorded(ops: Ledger) -> None:
    """Invariant: recording an outcome is fenced by the caller's live lease: once another
    worker took the step over, the first holder's late answer cannot overwrite the current
    holder's record."""
    OUTSIDE.reset()
    run_id = ops.start_run("test_outcome_send", {})
    short = StepStore(ops.url, ops.keys, lease_ttl_s=0.2)
    second = StepStore(ops.url, ops.keys, lease_ttl_s=30)
    try:
        first = short.claim(run_id, 0, "first:1")
        assert isinstance(first, Claim)
        stale = EffectStore(short.conn, ops.keys)
        effect, _ = stale.intend(Intent(
            effect_id="e" * 64, effect_type="test.outcome.with_lookup", run_id=run_id,
            tenant_id="default", seq=0, step="send", command_id="send@0#1",
            tool_class="irreversible", request_hash="h", recipient=None, payload={},
            lease_epoch=first.epoch))
        late = stale.begin_attempt(effect, EffectAttemptKind.CALL, worker="first:1",
                                   epoch=first.epoch, cover_s=0.3)
        taken = wait_for(lambda: isinstance(c := second.claim(run_id, 0, "second:2"), Claim)
                         and c, timeout=10,
                         what="the lease to expire and the step to be taken over")
        assert isinstance(taken, Claim)
        current = EffectStore(second.conn, ops.keys)
        attempt = current.begin_attempt(effect, EffectAttemptKind.LOOKUP, worker="second:2",
                                        epoch=taken.epoch, cover_s=5)
        current.record(effect, attempt, outcome="found", status=EffectStatus.COMPLETED,
                       provider_ref="obj_current", result={"id": "obj_current"},
                       reconciled=True, epoch=taken.epoch)
        with pytest.raises(EffectFenced):
            stale.record(effect, late, outcome="completed", status=EffectStatus.FAILED,
                         provider_ref="obj_stale", error={"late": True}, epoch=first.epoch)
    finally:
        short.close()
        second.close()
    [recorded] = ops.effects(run_id)
    assert (recorded.status, recorded.provider_ref) == (EffectStatus.COMPLETED, "obj_current")
    outcomes = [a.outcome for a in ops.effect_attempts(recorded)]
    assert outcomes == [None, "found"]


def test_begin_attempt__extends_the_lease_over_the_call_timeout(ops: Ledger) -> None:
    """Invariant: the statement that begins a provider call extends the caller's live lease
    to cover the call's timeout plus the margin; with the lease expired, the call is not
    started (no attempt is recorded)."""
    run_id = ops.start_run("test_outcome_send", {})
    store = StepStore(ops.url, ops.keys, lease_ttl_s=1.0)
    try:
        claim = store.claim(run_id, 0, "w:1")
        assert isinstance(claim, Claim)
        effects = EffectStore(store.conn, ops.keys)
        effect, _ = effects.intend(Intent(
            effect_id="c" * 64, effect_type="test.outcome.with_lookup", run_id=run_id,
            tenant_id="default", seq=0, step="send", command_id="send@0#1",
            tool_class="irreversible", request_hash="h", recipient=None, payload={},
            lease_epoch=claim.epoch))
        effects.begin_attempt(effect, EffectAttemptKind.CALL, worker="w:1", epoch=claim.epoch,
                              cover_s=20.0)
        with ops.engine.connect() as conn:
            left = conn.execute(sa.text(
                "SELECT extract(epoch FROM lease_expires_at - onward.now()) FROM onward.runs "
                "WHERE id = :id"), {"id": run_id}).scalar_one()
        assert 15 < float(left) <= 20
        with ops.engine.begin() as conn:  # the lease runs out (a paused worker)
            conn.execute(sa.text("UPDATE onward.runs SET lease_expires_at = onward.now() "
                                 "- interval '1 second' WHERE id = :id"), {"id": run_id})
        with pytest.raises(EffectFenced):
            effects.begin_attempt(effect, EffectAttemptKind.CALL, worker="w:1",
                                  epoch=claim.epoch, cover_s=20.0)
    finally:
        store.close()
    assert len(ops.effect_attempts(ops.effects(run_id)[0])) == 1


def test_tool_timeout__the_callable_is_given_the_tools_timeout(drv: Driver) -> None:
    """Invariant: a tool's call and lookup receive its ``timeout_s`` as ``timeout=``."""
    run_id = lost_first_answer(drv)
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    assert OUTSIDE.timeouts == [7.0, 7.0]  # the call, then the lookup that found it


def test_cancel__idle_run_with_unknown_effect_is_reconciled_by_a_worker(
        drv: Driver, ops: Ledger) -> None:
    """Invariant: cancelling an idle run whose effect's outcome is unknown neither closes
    nor abandons that effect: a worker looks it up (found: recorded ``completed``) and then
    ends the run ``cancelled``, without running the step again."""
    run_id = lost_first_answer(drv)
    cancelled = ops.cancel(run_id, "customer withdrew")
    assert cancelled.requested is True
    assert ops.get_run(run_id).status is RunStatus.RUNNING
    run = drv.drive(run_id)
    assert run.status is RunStatus.CANCELLED
    assert run.last_error["by"] == "olga"
    effect = one_effect(ops, run_id)
    assert (effect.status, effect.reconciled) == (EffectStatus.COMPLETED, True)
    kinds = [a.kind for a in ops.effect_attempts(effect)]
    assert kinds == ["call", "lookup"]
    assert OUTSIDE.count() == 1


def test_cancel__unknown_outcome_that_cannot_be_asked_parks_then_a_person_decides(
        drv: Driver, ops: Ledger) -> None:
    """Invariant: when the tool has no lookup, the cancelled run is parked
    ``effect_outcome_unknown`` (its effect stays pending); cancelling it again is a
    person's decision: the run ends ``cancelled`` and the effect is still not closed."""
    run_id = lost_first_answer(drv, "blind")
    ops.cancel(run_id, "customer withdrew")
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "effect_outcome_unknown")
    again = ops.cancel(run_id, "checked the provider: keep the object, stop the run")
    assert again.requested is False and len(again.effects_left_unknown) == 1
    assert ops.get_run(run_id).status is RunStatus.CANCELLED
    assert one_effect(ops, run_id).status is EffectStatus.PENDING
    assert OUTSIDE.count() == 1


# -- a job polled past its status timeout (review F6) ----------------------------------------
@pytest.fixture()
def offset() -> list[timedelta]:
    """How far ahead the clocks of ``later`` (and the worker, when a test moves it) run."""
    return [timedelta(0)]


@pytest.fixture()
def later(ops: Ledger, offset: list[timedelta]) -> Iterator[Ledger]:
    """The operator's ledger on an engine whose clock runs ``offset[0]`` ahead."""
    engine = sa.create_engine(ops.engine.url)
    clock.follow_engine(engine, offset)
    yield Ledger(engine, ops.settings).acting_as("olga", Role.OPERATOR)
    engine.dispose()


def stalled_job(drv: Driver, ops: Ledger, offset: list[timedelta]) -> UUID:
    """A run whose job the provider accepted, polled past its tool's 60 s status timeout:
    parked ``effect_stalled``."""
    run_id = drv.ledger.start_run("test_outcome_send", {"tool": "job"})
    assert drv.step(run_id, 0).kind is ReportKind.WAITING  # accepted; polled later
    offset[0] = timedelta(seconds=120)
    clock.set_on_store(drv.store, offset[0])
    assert drv.step(run_id, 0).kind is ReportKind.PARKED
    assert ops.get_run(run_id).parked_reason == "effect_stalled"
    return run_id


def test_stalled_effect__continue_polls_the_provider_again(
        drv: Driver, ops: Ledger, later: Ledger, offset: list[timedelta]) -> None:
    """Invariant (docs/operating.md, review F6): a person who continues a run parked
    ``effect_stalled`` gets one more status poll: the job finished meanwhile, so the run
    completes with its result (it used to re-park at once without asking)."""
    run_id = stalled_job(drv, ops, offset)
    OUTSIDE.job_done = True
    polls = OUTSIDE.status_polls
    later.continue_run(run_id, "the provider says the job is done")
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, (run.parked_reason, run.last_error)
    assert OUTSIDE.status_polls - polls == 1
    assert one_effect(ops, run_id).status is EffectStatus.COMPLETED


def test_stalled_effect__the_provider_is_asked_once_more_before_the_run_parks(
        drv: Driver, ops: Ledger) -> None:
    """Invariant: past its tool's ``status_timeout_s`` an accepted job is polled once more
    before the run is parked ``effect_stalled``: a job that finished meanwhile completes
    the run instead (the stall check used to park without asking)."""
    run_id = drv.ledger.start_run("test_outcome_send", {"tool": "job"})
    assert drv.step(run_id, 0).kind is ReportKind.WAITING
    OUTSIDE.job_done = True
    clock.set_on_store(drv.store, timedelta(seconds=120))
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, (run.parked_reason, run.last_error)


def test_stalled_effect__continue_opens_a_fresh_polling_window(
        drv: Driver, ops: Ledger, later: Ledger, offset: list[timedelta]) -> None:
    """Invariant: after continue, a job still running is polled again for another
    ``status_timeout_s`` (the run waits, it is not re-parked at once), and parks again only
    once that window has passed too."""
    run_id = stalled_job(drv, ops, offset)
    later.continue_run(run_id, "the job is slow today; poll it again")
    assert drv.step(run_id, 0).kind is ReportKind.WAITING
    offset[0] = timedelta(seconds=150)  # 30 s into the new window
    clock.set_on_store(drv.store, offset[0])
    assert drv.step(run_id, 0).kind is ReportKind.WAITING
    offset[0] = timedelta(seconds=200)  # 80 s into it: past the 60 s limit
    clock.set_on_store(drv.store, offset[0])
    assert drv.step(run_id, 0).kind is ReportKind.PARKED
    assert ops.get_run(run_id).parked_reason == "effect_stalled"


# -- a person resolves an effect by hand (review F11) ----------------------------------------
@pytest.fixture()
def admin(ledger: Ledger) -> Ledger:
    return ledger.acting_as("ada", Role.ADMIN)


def parked_unknown(drv: Driver) -> UUID:
    """A run whose irreversible call (no lookup, no provider dedupe) acted and lost its
    answer: its next attempt parks it ``effect_outcome_unknown``."""
    run_id = lost_first_answer(drv, "blind")
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "effect_outcome_unknown")
    return run_id


def test_resolve__a_person_who_found_the_object_finishes_the_run_with_it(
        drv: Driver, ops: Ledger, admin: Ledger) -> None:
    """Invariant (design 1 and 13.2: an external write happens once *or a person decides*;
    review F11): a person who checked the provider and found the object records it
    (admin, with a reason, audited); ``continue`` then finishes the run with that object,
    and nothing is sent again. One object."""
    run_id = parked_unknown(drv)
    effect = one_effect(ops, run_id)
    plan = operations.resolve_plan(effect, operations.Finding.COMPLETED, "obj_1",
                                   {"id": "obj_1", "n": 1})
    with pytest.raises(PermissionDenied):  # an operator may not: admin only
        ops.resolve_effect(effect.effect_type, effect.effect_id, "found it", plan,
                           finding=operations.Finding.COMPLETED, provider_ref="obj_1")
    done = admin.resolve_effect(effect.effect_type, effect.effect_id,
                                "found obj_1 in the provider's dashboard", plan,
                                finding=operations.Finding.COMPLETED, provider_ref="obj_1",
                                result={"id": "obj_1", "n": 1})
    assert (done.status, done.provider_ref, done.reconciled) == (
        EffectStatus.COMPLETED, "obj_1", True)
    kinds = [(a.kind, a.outcome) for a in ops.effect_attempts(done)]
    assert kinds == [("call", "unknown"), ("resolve", "found")]
    assert ops.effect_attempts(done)[-1].worker == "operator:ada"
    ops.continue_run(run_id, "the payment exists: obj_1")
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    assert run.result == {"sent": "obj_1"}
    assert OUTSIDE.count() == 1
    assert ops.verify_run(run_id) == []  # the finding is signed like every effect record
    done_row, refused_row = ops.audit(run_id=run_id, action="resolve_effect")  # newest first
    assert (refused_row.actor, refused_row.outcome) == ("olga", "refused")
    entry = done_row
    assert (entry.actor, entry.outcome, entry.reason) == (
        "ada", "done", "found obj_1 in the provider's dashboard")
    assert entry.details is not None and entry.details["finding"] == "completed"


def test_resolve__not_sent_lets_the_run_send_it_once_with_the_same_key(
        drv: Driver, ops: Ledger, admin: Ledger, later: Ledger,
        offset: list[timedelta]) -> None:
    """Invariant: a person who found nothing at the provider records ``not_sent``: the
    effect is closed ``unsent`` and the continued run sends it once, with the same key.
    The lost call may still land for ONWARD_CALL_LANDING_S after it ended, so not_sent is
    refused until then (tests/integration/test_resolve_in_flight.py): the person looks
    again after that time (the database's clock moved) and still finds nothing."""
    run_id = parked_unknown(drv)
    OUTSIDE.objects.clear()  # the provider never kept it (the person checked: nothing)
    effect = one_effect(ops, run_id)
    plan = operations.resolve_plan(effect, operations.Finding.NOT_SENT, None, None)
    with pytest.raises(OperationRefused, match="may still land"):
        admin.resolve_effect(effect.effect_type, effect.effect_id, "nothing there", plan,
                             finding=operations.Finding.NOT_SENT)
    offset[0] = timedelta(seconds=admin.settings.call_landing_s + 1)
    clock.set_on_store(drv.store, offset[0])
    done = later.acting_as("ada", Role.ADMIN).resolve_effect(
        effect.effect_type, effect.effect_id, "nothing there, looked again", plan,
        finding=operations.Finding.NOT_SENT)
    assert done.status is EffectStatus.UNSENT
    later.continue_run(run_id, "the provider holds nothing: send it")
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    assert OUTSIDE.count() == 1 and OUTSIDE.count(effect.effect_id) == 1
    assert one_effect(ops, run_id).status is EffectStatus.COMPLETED
    assert ops.verify_run(run_id) == []


def test_resolve__refused_unless_the_outcome_is_unknown_and_the_plan_still_holds(
        drv: Driver, ops: Ledger, admin: Ledger) -> None:
    """Invariant: only an effect whose outcome onward cannot know is resolved by a person,
    as it stood in the plan that was confirmed; each refusal is audited and changes
    nothing."""
    run_id = parked_unknown(drv)
    effect = one_effect(ops, run_id)
    stale = {**operations.resolve_plan(effect, operations.Finding.NOT_SENT, None, None),
             "attempts": effect.attempts - 1}
    with pytest.raises(OperationRefused, match="changed since the plan"):
        admin.resolve_effect(effect.effect_type, effect.effect_id, "x", stale,
                             finding=operations.Finding.NOT_SENT)
    plan = operations.resolve_plan(effect, operations.Finding.COMPLETED, None, None)
    with pytest.raises(InvalidInput, match="provider-ref"):
        admin.resolve_effect(effect.effect_type, effect.effect_id, "x", plan,
                             finding=operations.Finding.COMPLETED)
    admin.resolve_effect(effect.effect_type, effect.effect_id, "found", plan,
                         finding=operations.Finding.COMPLETED, provider_ref="obj_1")
    again = operations.resolve_plan(one_effect(ops, run_id), operations.Finding.NOT_SENT,
                                    None, None)
    with pytest.raises(OperationRefused, match="its outcome is known"):
        admin.resolve_effect(effect.effect_type, effect.effect_id, "x", again,
                             finding=operations.Finding.NOT_SENT)
    refused = [a for a in ops.audit(run_id=run_id, action="resolve_effect")
               if a.outcome == "refused"]
    assert len(refused) == 3
    assert one_effect(ops, run_id).provider_ref == "obj_1"


def test_resolve__an_accepted_job_can_be_recorded_completed_not_unsent(
        drv: Driver, ops: Ledger, admin: Ledger, later: Ledger,
        offset: list[timedelta]) -> None:
    """Invariant: an effect the provider accepted reached it: a person may record what the
    job came to (completed), never that it was not sent."""
    run_id = stalled_job(drv, ops, offset)
    effect = one_effect(ops, run_id)
    not_sent = operations.resolve_plan(effect, operations.Finding.NOT_SENT, None, None)
    with pytest.raises(OperationRefused, match="accepted by the provider"):
        admin.resolve_effect(effect.effect_type, effect.effect_id, "x", not_sent,
                             finding=operations.Finding.NOT_SENT)
    plan = operations.resolve_plan(effect, operations.Finding.COMPLETED, effect.provider_ref,
                                   {"id": effect.provider_ref, "report": "ready"})
    admin.resolve_effect(effect.effect_type, effect.effect_id, "the job's page says done",
                         plan, finding=operations.Finding.COMPLETED,
                         provider_ref=effect.provider_ref,
                         result={"id": effect.provider_ref, "report": "ready"})
    later.continue_run(run_id, "the job is done")
    polls = OUTSIDE.status_polls
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    assert OUTSIDE.status_polls == polls  # the recorded result is used: nothing asked
