"""A step after a wait runs only on what ended the wait, as the MAC'd control signs it
(issue 11, docs/design.md section 13 invariant 5; docs/security.md): someone with write access
to the database but not the MAC key who makes a waiting run runnable (its row set
``running``, ``waiting_on`` cleared; a timer's outbox row made due) gets the run parked
``integrity`` before its step runs, with nothing decided, consumed or called. The
legitimate ways past a wait (a signal, a decision, a timeout, the timer's time) still go
on. Steps are executed by the real executor (tests/support/driver.py); each edit is made
in the database, as such an attacker would."""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

import pytest

from ledger import Ledger, RunStatus
from ledger.exceptions import OperationRefused
from ledger.recovery import RecoveryStore
from ledger.runs import Run
from tasks.executor import ReportKind
from tests.support import clock, reads
from tests.support.cluster import wait_for
from tests.support.driver import Driver, driver_fixture

MODULES = ["tests.workflows_waits"]


drv = driver_fixture(MODULES)


def waiting(drv: Driver, workflow: str, state: dict[str, object]) -> Run:
    run_id = drv.ledger.start_run(workflow, state)
    run = drv.drive(run_id)
    assert run.status is RunStatus.WAITING, run
    return run


def set_running(ledger: Ledger, run_id: UUID, step: str | None = None) -> None:
    """What an attacker with write access to the database does: the run, runnable."""
    assert reads.execute(
        ledger.engine, "UPDATE onward.runs SET status = 'running', waiting_on = NULL, "
        "wait_until = NULL, step = coalesce(CAST(:step AS text), step) WHERE id = :r",
        r=run_id, step=step) == 1


def parked_integrity(drv: Driver, run_id: UUID, says: str) -> None:
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity"), run
    message = reads.run_row(drv.ledger.engine, run_id)["last_error"]["message"]
    assert says in message, message
    assert "did not run" in message


def test_a_signal_wait_set_running_without_its_signal_parks(drv: Driver) -> None:
    """Invariant: the step that follows a signal wait runs only after a signal of that name
    ended the wait (consumed at that seq). The run set running in the database, with no
    signal sent, parks integrity; the step never reads ``ctx.signal`` as None. Failed
    before: the run completed with ``{"payload": None}``."""
    run = waiting(drv, "test_signal", {})
    set_running(drv.ledger, run.id)
    parked_integrity(drv, run.id, "no signal of that name ended the wait")
    assert drv.ledger.get_run(run.id).result is None


def test_a_signal_sent_after_the_edit_does_not_unpark(drv: Driver) -> None:
    """Invariant: a run parked for an edited wait is not resumed by a signal sent later
    (it no longer waits; the signal is kept, not consumed)."""
    run = waiting(drv, "test_signal", {})
    set_running(drv.ledger, run.id)
    parked_integrity(drv, run.id, "no signal")
    assert drv.ledger.signal(run.id, "go", {"n": 1}) is False
    assert drv.ledger.get_run(run.id).status is RunStatus.NEEDS_REVIEW


def test_a_wait_whose_timeout_also_goes_on_parks_before_its_timeout(drv: Driver) -> None:
    """Invariant: a wait that goes on at the same step on a signal or a timeout lets that
    step run without a signal only once its signed timeout has passed: set running an hour
    early, it parks. Failed before: it completed with ``{"reply": None}``."""
    run = waiting(drv, "test_signal_or_none", {"timeout_s": 3600})
    set_running(drv.ledger, run.id)
    parked_integrity(drv, run.id, "no signal of that name ended the wait")


def test_a_wait_that_timed_out_into_its_then_step_goes_on(drv: Driver) -> None:
    """Invariant: the legitimate way to ``then`` without a signal still works: the wait
    times out (the reaper resumes it at its ``on_timeout``, which is ``then``) and the step
    reads no signal."""
    run = waiting(drv, "test_signal_or_none", {"timeout_s": 0.2})
    recovery = RecoveryStore(drv.ledger.engine)
    wait_for(lambda: recovery.sweep(stall_after_s=60).waits.signal_timeouts == 1,
             timeout=20, what="the signal wait to time out")
    done = drv.drive(run.id)
    assert done.status is RunStatus.COMPLETED and done.result == {"reply": None}, done
    assert drv.ledger.verify_run(run.id) == []


def test_a_signal_wait_routed_to_its_timeout_step_early_parks(drv: Driver) -> None:
    """Invariant: a signal wait's ``on_timeout`` step runs only once the signed timeout has
    passed: the run set running at ``gave_up`` an hour early parks. Failed before: it
    completed ``timed_out`` while its wait had an hour left."""
    run = waiting(drv, "test_signal_or_timeout", {"timeout_s": 3600})
    set_running(drv.ledger, run.id, step="gave_up")
    parked_integrity(drv, run.id, "times out only at")


def test_a_signal_wait_still_resumes_on_its_signal(drv: Driver) -> None:
    """Invariant: a signal sent to the waiting run resumes ``then`` with its payload."""
    run = waiting(drv, "test_signal_or_timeout", {"timeout_s": 3600})
    assert drv.ledger.signal(run.id, "reply", {"ok": True}) is True
    done = drv.drive(run.id)
    assert done.status is RunStatus.COMPLETED and done.result == {"reply": {"ok": True}}


def test_an_approval_wait_set_running_without_a_decision_parks(drv: Driver) -> None:
    """Invariant: the approved step runs only on a decision: the run set running at it
    while its approval is pending parks integrity (not failed: nothing was decided, and a
    database edit must not end a run with a signed failure); the approval stays pending.
    Failed before: the run ended failed (``approval_invalid``)."""
    run = waiting(drv, "test_review", {})
    set_running(drv.ledger, run.id, step="act")
    parked_integrity(drv, run.id, "but that approval is pending")
    [approval] = drv.ledger.approvals(run_id=run.id)
    assert approval.status.value == "pending"


def test_a_timer_made_due_early_parks(drv: Driver) -> None:
    """Invariant: a timer's step runs from the time its checkpoint signs, never before: its
    outbox row made due now (an hour early) gets the step claimed, and it parks instead of
    running. Failed before: the run completed an hour early."""
    run_id = drv.ledger.start_run("test_timer", {"seconds": 3600})
    drv.step(run_id, 0)
    run = drv.ledger.get_run(run_id)
    assert (run.status, run.seq, str(run.waiting_on).startswith("timer:")) == (
        RunStatus.RUNNING, 1, True), run
    assert reads.execute(drv.ledger.engine, "UPDATE onward.outbox SET due_at = now() "
                         "WHERE run_id = :r", r=run_id) == 1
    parked_integrity(drv, run_id, "the time checkpoint 1's timer runs it")


def test_a_timer_runs_its_step_when_due(drv: Driver) -> None:
    """Invariant: a timer that is due runs its step as before."""
    run_id = drv.ledger.start_run("test_timer", {"seconds": 0.2})
    drv.step(run_id, 0)
    wait_for(lambda: drv.step(run_id, 1).kind is not ReportKind.STALE, timeout=20,
             what="the timer's step to run")
    assert drv.ledger.get_run(run_id).status is RunStatus.COMPLETED


# -- an operator's continue of a run parked at a wait puts it back on that wait ---------------
def outbox_due(ledger: Ledger, run_id: UUID) -> datetime:
    [row] = reads.outbox_rows(ledger.engine, run_id)
    return row["due_at"]


def test_continue_of_a_parked_timer_queues_its_step_at_the_timer(drv: Driver) -> None:
    """Invariant: ``onward runs continue`` of a run parked at a timer's checkpoint before
    its time queues the step due at the time the checkpoint signs, not now: nothing claims
    it early, and it is not parked again. Failed before: continue queued it now, and its
    claim parked ``integrity`` (claimed before the timer's time)."""
    run_id = drv.ledger.start_run("test_timer", {"seconds": 3600})
    drv.step(run_id, 0)
    until = drv.ledger.get_run(run_id).waiting_on.removeprefix("timer:")
    reads.execute(drv.ledger.engine, "UPDATE onward.outbox SET due_at = now() "
                  "WHERE run_id = :r", r=run_id)
    parked_integrity(drv, run_id, "the time checkpoint 1's timer runs it")

    drv.ledger.continue_run(run_id, "checked the edit; let it sleep")
    assert drv.step(run_id, 1).kind is ReportKind.STALE  # not due: nothing claimed
    run = drv.ledger.get_run(run_id)
    assert (run.status, run.seq, run.waiting_on) == (RunStatus.RUNNING, 1, f"timer:{until}")
    assert outbox_due(drv.ledger, run_id) == datetime.fromisoformat(until)


def test_continue_of_a_parked_signal_wait_waits_for_the_signal_again(drv: Driver) -> None:
    """Invariant: continue of a run parked at a signal wait that no signal ended puts it
    back to waiting for that signal (its timeout as signed), and the signal resumes it.
    Failed before: continue queued the step now, which parked ``integrity`` again."""
    run = waiting(drv, "test_signal_or_timeout", {"timeout_s": 3600})
    set_running(drv.ledger, run.id)
    parked_integrity(drv, run.id, "no signal of that name ended the wait")

    drv.ledger.continue_run(run.id, "checked the edit")
    again = drv.ledger.get_run(run.id)
    assert (again.status, again.step, again.waiting_on) == (
        RunStatus.WAITING, "replied", "signal:reply")
    assert again.wait_until == run.wait_until
    assert drv.ledger.signal(run.id, "reply", {"ok": True}) is True
    done = drv.drive(run.id)
    assert done.status is RunStatus.COMPLETED and done.result == {"reply": {"ok": True}}


def test_continue_of_a_parked_signal_wait_takes_a_signal_kept_meanwhile(drv: Driver) -> None:
    """Invariant: a signal sent while the run was parked (kept, not consumed) ends the wait
    the continue puts the run back on, at once."""
    run = waiting(drv, "test_signal", {})
    set_running(drv.ledger, run.id)
    parked_integrity(drv, run.id, "no signal")
    assert drv.ledger.signal(run.id, "go", {"n": 1}) is False
    drv.ledger.continue_run(run.id, "checked the edit")
    assert drv.ledger.get_run(run.id).status is RunStatus.RUNNING
    done = drv.drive(run.id)
    assert done.status is RunStatus.COMPLETED and done.result == {"payload": {"n": 1}}


def test_continue_of_a_parked_approval_wait_waits_for_the_decision(drv: Driver) -> None:
    """Invariant: continue of a run parked at an approval wait whose approval is pending
    puts it back to waiting for that approval, at the step approving resumes; approving
    then goes on. Failed before: continue queued ``act`` now, which parked again."""
    run = waiting(drv, "test_review", {})
    set_running(drv.ledger, run.id, step="act")
    parked_integrity(drv, run.id, "but that approval is pending")

    drv.ledger.continue_run(run.id, "checked the edit")
    [asked] = drv.ledger.approvals(run_id=run.id)
    again = drv.ledger.get_run(run.id)
    assert (again.status, again.step, again.waiting_on) == (
        RunStatus.WAITING, "act", f"approval:{asked.id}")
    drv.ledger.acting_as("alice", "approver").approve(
        asked.id, artifact_hash=asked.artifact_hash)
    done = drv.drive(run.id)
    assert done.status is RunStatus.COMPLETED and done.result["status"] == "approved", done


def test_continue_of_a_run_whose_wait_ended_runs_its_step_now(drv: Driver) -> None:
    """Invariant: a run whose wait did end (its signal consumed at that seq) and that was
    parked after is continued at its step now, as before."""
    run = waiting(drv, "test_signal", {})
    assert drv.ledger.signal(run.id, "go", {"n": 2}) is True
    reads.execute(drv.ledger.engine, "UPDATE onward.runs SET status = 'needs_review', "
                  "parked_reason = 'crash_loop' WHERE id = :r", r=run.id)
    drv.ledger.continue_run(run.id, "crash fixed")
    done = drv.drive(run.id)
    assert done.status is RunStatus.COMPLETED and done.result == {"payload": {"n": 2}}


def test_continue_of_a_parked_run_whose_approval_expired_with_no_step_is_refused(
        drv: Driver) -> None:
    """Invariant: an approval that expired while its run was parked, with no ``on_expire``
    step, is not gone past by continue: refused, saying what to do, the run left parked.
    Failed before: continue queued the approved step, which parked ``integrity`` again.
    The approval expires by the ledger's clock moved past it once the run is parked (a
    real half-second expiry could pass before the park under load, changing its reason)."""
    run = waiting(drv, "test_review_strict", {"expires_s": 60})
    set_running(drv.ledger, run.id, step="done")
    parked_integrity(drv, run.id, "but that approval is pending")
    clock.follow_engine(drv.ledger.engine, [timedelta(seconds=120)])
    RecoveryStore(drv.ledger.engine).sweep(stall_after_s=60)
    assert drv.ledger.approvals(run_id=run.id)[0].status.value == "expired"
    with pytest.raises(OperationRefused, match=r"which is expired .*replay or branch it"):
        drv.ledger.continue_run(run.id, "checked the edit")
    assert drv.ledger.get_run(run.id).status is RunStatus.NEEDS_REVIEW


EXPIRED = "UPDATE onward.approvals SET status = 'expired' WHERE run_id = :r"


@pytest.mark.parametrize("decided", [False, True], ids=["pending", "approved"])
def test_an_approval_marked_expired_early_does_not_run_its_expiry_step(
        drv: Driver, decided: bool) -> None:
    """Invariant: an approval's ``on_expire`` step runs only once the expiry its terms sign
    has passed: the approval marked ``expired`` in the database an hour early, pending or
    already approved by alice, with the run set running at ``lapsed``, parks integrity
    before the step runs (a person's approval is not turned into its expiry). Failed
    before: the run completed through ``lapsed`` with the approval's hour still to run."""
    run = waiting(drv, "test_review_expiring", {"expires_s": 3600})
    [asked] = drv.ledger.approvals(run_id=run.id)
    if decided:
        drv.ledger.acting_as("alice", "approver").approve(
            asked.id, artifact_hash=asked.artifact_hash)
    assert reads.execute(drv.ledger.engine, EXPIRED, r=run.id) == 1
    set_running(drv.ledger, run.id, step="lapsed")
    parked_integrity(drv, run.id, "expires only at")


def test_an_approval_that_expired_runs_its_expiry_step(drv: Driver) -> None:
    """Invariant: the reaper's expiry of an approval whose signed time has passed still goes
    on to ``on_expire``, and the run completes there."""
    run = waiting(drv, "test_review_expiring", {"expires_s": 0.2})
    wait_for(lambda: RecoveryStore(drv.ledger.engine).sweep(
        stall_after_s=600).waits.approvals_expired == 1, timeout=10,
        what="the reaper expiring the approval")
    done = drv.drive(run.id)
    assert done.status is RunStatus.COMPLETED, done
    assert done.result["decided_by"] == "nobody: it expired"
    [expired] = drv.ledger.approvals(run_id=run.id)
    assert expired.status.value == "expired"
