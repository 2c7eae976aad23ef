"""What a step reads of its wait is what was signed (issue 11): a signal is signed when it
is sent (run, name, payload); the step that consumes it, and an evidence replay that reads
its source's, check it, so a payload edited in onward.signals parks the run (integrity)
instead of being read, and `verify` reports it. An evidence replay follows its source's
approval only as the decision and the approval's terms were signed."""

from __future__ import annotations

from uuid import UUID

import pytest

from ledger import Ledger, RunStatus
from ledger.exceptions import IntegrityViolation
from ledger.recovery import RecoveryStore
from ledger.vocabulary import LaunchMode
from tests.integration.test_console_http import drv  # noqa: F401 - fixture
from tests.support import reads
from tests.support.driver import Driver

SENT = {"amount": 100}


def edit_payload(ledger: Ledger, run_id: UUID) -> None:
    assert reads.execute(ledger.engine, "UPDATE onward.signals SET payload = "
                         "'{\"amount\": 1000000}' WHERE run_id = :r", r=run_id) == 1


def signal_problems(ledger: Ledger, run_id: UUID) -> list[str]:
    return [p.detail for p in ledger.verify_run(run_id) if p.kind == "signal"]


def test_an_edited_signal_payload_parks_the_step_that_reads_it(drv: Driver) -> None:  # noqa: F811
    """Invariant: the step resumed by a signal whose payload was edited in the database
    parks integrity and reads nothing; verify names the signal. Failed before: the run
    completed with the edited payload as its result."""
    run_id = drv.ledger.start_run("test_signal", {})
    assert drv.drive(run_id).status is RunStatus.WAITING
    assert drv.ledger.signal(run_id, "go", SENT) is True
    edit_payload(drv.ledger, run_id)
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")
    assert "signal 'go'" in reads.run_row(drv.ledger.engine, run_id)["last_error"]["message"]
    assert signal_problems(drv.ledger, run_id) != []


def test_an_early_signal_is_signed_and_read(drv: Driver) -> None:  # noqa: F811
    """Invariant: a signal sent before the run waits is kept signed and read as sent."""
    run_id = drv.ledger.start_run("test_signal", {})
    assert drv.ledger.signal(run_id, "go", SENT) is False
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED and run.result == {"payload": SENT}
    assert drv.ledger.verify_run(run_id) == []


def test_an_evidence_replay_does_not_read_an_edited_signal(drv: Driver) -> None:  # noqa: F811
    """Invariant: an evidence replay reads its source's signal only if it verifies: edited
    after the source finished, the replay parks integrity instead of finishing with it.
    Failed before: the replay completed with the edited payload."""
    run_id = drv.ledger.start_run("test_signal", {})
    drv.drive(run_id)
    drv.ledger.signal(run_id, "go", SENT)
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    edit_payload(drv.ledger, run_id)
    launched = drv.ledger.acting_as("olga", "operator").replay(
        run_id, 0, LaunchMode.EVIDENCE, "check it")
    run = drv.drive(launched.run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")


def test_an_evidence_replay_does_not_follow_a_forged_decision(drv: Driver) -> None:  # noqa: F811
    """Invariant: an evidence replay follows its source's approval only as the decision was
    signed: an approval set to 'approved' in the database (no decision MAC) stops the
    replay (refused at launch from the wait, parked from an earlier checkpoint) instead of
    releasing the approved step. Failed before: the replay completed, approved by
    'mallory'."""
    run_id = drv.ledger.start_run("test_review", {})
    assert drv.drive(run_id).status is RunStatus.WAITING
    assert reads.execute(drv.ledger.engine, "UPDATE onward.approvals SET status = 'approved', "
                         "decided_by = 'mallory', decided_at = now() WHERE run_id = :r",
                         r=run_id) == 1
    olga = drv.ledger.acting_as("olga", "operator")
    launched = olga.replay(run_id, 0, LaunchMode.EVIDENCE, "check it")
    run = drv.drive(launched.run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity"), run
    with pytest.raises(IntegrityViolation, match="decision"):
        olga.replay(run_id, drv.ledger.get_run(run_id).seq, LaunchMode.EVIDENCE, "check it")


def test_a_copied_signal_row_parks_the_step_that_reads_it(drv: Driver) -> None:  # noqa: F811
    """Invariant: a signal ends one wait. A copy of a signed signal row, inserted in the
    database before the run waits for the same name again, is consumed by that wait but parks
    the step that reads it (integrity) and verify names it. Failed before: the MAC did not
    cover the row, so the copy verified and the run completed having read one signal twice."""
    run_id = drv.ledger.start_run("test_signal_twice", {})
    assert drv.drive(run_id).status is RunStatus.WAITING
    assert drv.ledger.signal(run_id, "go", SENT) is True
    assert reads.execute(drv.ledger.engine, "INSERT INTO onward.signals (run_id, name, "
                         "payload, mac) SELECT run_id, name, payload, mac FROM onward.signals "
                         "WHERE run_id = :r", r=run_id) == 1
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity"), run
    assert "signal 'go'" in reads.run_row(drv.ledger.engine, run_id)["last_error"]["message"]
    assert len(signal_problems(drv.ledger, run_id)) == 1


def test_a_signal_sent_twice_is_read_twice(drv: Driver) -> None:  # noqa: F811
    """Invariant: two signals sent under one name end two waits, each read as sent."""
    run_id = drv.ledger.start_run("test_signal_twice", {})
    drv.drive(run_id)
    assert drv.ledger.signal(run_id, "go", {"n": 1}) is True
    assert drv.drive(run_id).status is RunStatus.WAITING
    assert drv.ledger.signal(run_id, "go", {"n": 2}) is True
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED and run.result == {"seen": [{"n": 1}, {"n": 2}]}
    assert drv.ledger.verify_run(run_id) == []


def reset_consumed(ledger: Ledger, run_id: UUID) -> None:
    assert reads.execute(ledger.engine, "UPDATE onward.signals SET consumed_seq = NULL "
                         "WHERE run_id = :r AND consumed_seq IS NOT NULL", r=run_id) == 1


def test_a_consumed_signal_made_consumable_again_parks_the_later_wait(drv: Driver) -> None:  # noqa: F811
    """Invariant: a signal ends one wait, even if its consumption is undone in the database.
    The run read "go" once and waits for "go" again; consumed_seq is set back to NULL; the
    reaper wakes the waiting run with that signal (no new one sent): the resumed step parks
    integrity before running, and verify names the signal as soon as it is reset. Failed
    before: the run completed, having read one signal twice ({"seen": [{"n": 1}, {"n": 1}]})."""
    run_id = drv.ledger.start_run("test_signal_twice", {})
    drv.drive(run_id)
    assert drv.ledger.signal(run_id, "go", {"n": 1}) is True
    assert drv.drive(run_id).status is RunStatus.WAITING
    reset_consumed(drv.ledger, run_id)
    assert any("is not consumed" in p for p in signal_problems(drv.ledger, run_id))
    assert RecoveryStore(drv.ledger.engine).sweep(stall_after_s=60).waits.signals_delivered == 1
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity"), run
    assert "consumed before" in reads.run_row(drv.ledger.engine, run_id)["last_error"]["message"]


def test_a_reset_signal_is_not_taken_for_a_new_one(drv: Driver) -> None:  # noqa: F811
    """Invariant: a new signal sent to a run whose earlier signal of the same name was made
    consumable again wakes the run with the earlier one (the lowest id): the step parks
    integrity instead of reading the old payload as the new decision. Failed before: the
    run completed with {"seen": [{"n": 1}, {"n": 1}]}."""
    run_id = drv.ledger.start_run("test_signal_twice", {})
    drv.drive(run_id)
    assert drv.ledger.signal(run_id, "go", {"n": 1}) is True
    assert drv.drive(run_id).status is RunStatus.WAITING
    reset_consumed(drv.ledger, run_id)
    assert drv.ledger.signal(run_id, "go", {"n": 2}) is True
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity"), run


def test_a_branch_does_not_inherit_its_parents_signal_marks(drv: Driver) -> None:  # noqa: F811
    """Invariant: the marks a checkpoint carries name its run: a replay from the second wait
    (its checkpoint records the parent's signal) is resumed by its own signal and
    completes."""
    run_id = drv.ledger.start_run("test_signal_twice", {})
    drv.drive(run_id)
    drv.ledger.signal(run_id, "go", {"n": 1})
    waiting = drv.drive(run_id)
    assert waiting.status is RunStatus.WAITING
    launched = drv.ledger.acting_as("olga", "operator").replay(
        run_id, waiting.seq, LaunchMode.LIVE, "again")
    assert drv.ledger.signal(launched.run_id, "go", {"n": 3}) is True
    run = drv.drive(launched.run_id)
    assert run.status is RunStatus.COMPLETED and run.result == {"seen": [{"n": 1}, {"n": 3}]}
