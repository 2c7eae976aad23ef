"""One clock: every time the ledger compares or records is ``onward.now()``, the database's
time, which tests may move forward by a session offset (docs/design.md section 13, invariant 7)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from uuid import UUID

import psycopg
import pytest
import sqlalchemy as sa

from ledger import Ledger, OnwardSettings, RunStatus, operations
from ledger.db import libpq_conninfo
from ledger.recovery import RecoveryStore
from ledger.vocabulary import ApprovalStatus, Role
from tasks.executor import ReportKind
from tests.support import clock, reads
from tests.support.cluster import wait_for
from tests.support.driver import Driver, driver_fixture


def test_clock__onward_now_is_now_plus_the_session_offset(ledger: Ledger) -> None:
    """Without the setting, onward.now() is now(); with an offset of a day, every default
    timestamp the ledger writes (a new run's created_at) is a day ahead of now()."""
    with psycopg.connect(libpq_conninfo(ledger.url), autocommit=True) as conn:
        drift = conn.execute("SELECT extract(epoch FROM onward.now() - now())").fetchone()
        assert drift is not None and float(drift[0]) == 0.0
        clock.set_on_raw(conn, timedelta(days=1))
        ahead = conn.execute("SELECT extract(epoch FROM onward.now() - now())").fetchone()
        assert ahead is not None and float(ahead[0]) == 86400.0
    offset = [timedelta(days=1)]
    engine = sa.create_engine(ledger.url)
    clock.follow_engine(engine, offset)
    try:
        moved = Ledger(engine, ledger.settings)
        run_id = moved.start_run("test_chain", {"steps": 1})
        with engine.connect() as conn:
            lag = conn.execute(sa.text(
                "SELECT extract(epoch FROM created_at - now()) FROM onward.runs WHERE id = :id"),
                {"id": run_id}).scalar_one()
        assert 86000 < float(lag) <= 86400.5
    finally:
        engine.dispose()


# -- the Python side: what a step computes is in the database's time ---------------------
# Each test below moves the database's clock away from this host's (a worker whose wall
# clock is a day off, seen from the ledger): a time computed from the host's clock would
# land a day early or late; one computed from the claim's database time lands right.

DAY = timedelta(days=1)
WAITS = ["tests.workflows_waits"]


drv = driver_fixture(WAITS)


def _seconds(ledger: Ledger, sql: str, run_id: UUID) -> float:
    """``sql`` (an interval from ``now()``, the database's unmoved time) in seconds."""
    with ledger.engine.connect() as conn:
        return float(conn.execute(sa.text(sql), {"id": run_id}).scalar_one())


def test_clock__waits_are_timed_by_the_database_not_the_worker_host(
        ledger: Ledger, drv: Driver) -> None:
    """Invariant: a timer, an approval's expiry and a signal's timeout asked for by a step
    are 1 hour after the database's time at the step, whatever the worker host's clock
    says (here the database's clock runs a day ahead of it); the signal's timeout recorded
    in the MAC'd control is the one the run waits with, and verifies."""
    clock.set_on_store(drv.store, DAY)
    timer = ledger.start_run("test_timer", {"seconds": 3600})
    asking = ledger.start_run("test_review", {"expires_s": 3600})
    waiting = ledger.start_run("test_signal", {"timeout_s": 3600})
    for run_id in (timer, asking, waiting):
        drv.step(run_id, 0)
    ahead = DAY.total_seconds() + 3600
    due = _seconds(ledger, "SELECT extract(epoch FROM due_at - now()) FROM onward.outbox "
                           "WHERE run_id = :id", timer)
    expires = _seconds(ledger, "SELECT extract(epoch FROM expires_at - now()) "
                               "FROM onward.approvals WHERE run_id = :id", asking)
    until = _seconds(ledger, "SELECT extract(epoch FROM wait_until - now()) FROM onward.runs "
                             "WHERE id = :id", waiting)
    assert [round(value / 60) for value in (due, expires, until)] == [round(ahead / 60)] * 3
    control = ledger.checkpoints(waiting)[1].control
    assert control is not None and control["timeout_s"] == 3600
    run = ledger.get_run(waiting)
    assert run is not None and datetime.fromisoformat(control["timeout_at"]) == run.wait_until
    assert ledger.verify_run(waiting) == []


def test_clock__a_naive_sleep_until_is_refused(ledger: Ledger, drv: Driver) -> None:
    """Invariant: ctx.sleep_until with a datetime that has no time zone names no instant:
    the step fails with an error that says so (never read as UTC, never retried), and
    nothing is scheduled."""
    run_id = ledger.start_run("test_naive_sleep", {})
    run = drv.drive(run_id)
    assert run.status is RunStatus.FAILED
    assert run.last_error is not None and run.last_error["type"] == "OutcomeError"
    assert "no time zone" in run.last_error["message"]
    assert run.attempts_total == 1
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0]


def test_clock__an_accepted_effect_ages_by_the_database_clock(
        ledger: Ledger, drv: Driver) -> None:
    """Invariant: how long an accepted effect has been polled is measured by the database's
    clock: once it is past the tool's status timeout (600 s) there, the run is parked
    effect_stalled, whatever the worker host's clock says."""
    run_id = ledger.start_run("test_slow_job", {})
    assert drv.step(run_id, 0).kind is ReportKind.WAITING  # accepted: polled later
    clock.set_on_store(drv.store, timedelta(hours=1))
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "effect_stalled")


def test_clock__an_evidence_replay_of_a_timer_goes_on_by_the_database_clock(
        ledger: Ledger, drv: Driver, settings: OnwardSettings) -> None:
    """Invariant: an evidence replay does not wait out a recorded timer: the step after it
    is due at once by the database's clock, even when the worker host's clock is a day
    ahead of it (a host-clock due time would hold the replay for a day)."""
    parent = ledger.start_run("test_timer", {"seconds": 1})
    drv.step(parent, 0)
    clock.set_on_store(drv.store, timedelta(minutes=1))
    assert drv.drive(parent).status is RunStatus.COMPLETED
    behind = [-DAY]
    engine = sa.create_engine(ledger.url)
    clock.follow_engine(engine, behind)
    try:
        ops = Ledger(engine, settings).acting_as("olga", Role.OPERATOR)
        launched = ops.replay(parent, 0, "evidence", "audit the timer")
        clock.set_on_store(drv.store, -DAY)
        replay = drv.drive(launched.run_id)
    finally:
        engine.dispose()
    assert replay.status is RunStatus.COMPLETED, replay


def test_clock__a_replayed_signal_wait_times_out_after_the_timeout_the_step_asked_for(
        ledger: Ledger, drv: Driver) -> None:
    """Invariant: a replay from a checkpoint that waits for a signal with a 1-hour timeout
    waits 1 hour from its own start by the database's clock, even if the parent's step ran
    on a host whose clock was a day off."""
    clock.set_on_store(drv.store, DAY)
    parent = ledger.start_run("test_signal", {"timeout_s": 3600})
    assert drv.drive(parent).status is RunStatus.WAITING
    ops = ledger.acting_as("olga", Role.OPERATOR)
    launched = ops.replay(parent, 1, "live", "wait again")
    left = _seconds(ledger, "SELECT extract(epoch FROM wait_until - now()) FROM onward.runs "
                            "WHERE id = :id", launched.run_id)
    assert 3500 < left <= 3600


@pytest.mark.parametrize("command", ["cancel", "approve"])
def test_clock__reaper_expiry_locks_the_run_before_the_approval(
        ledger: Ledger, drv: Driver, settings: OnwardSettings, command: str) -> None:
    """Invariant: the reaper's approval expiry takes the run's row lock before the
    approval's, as cancel and approve do, so it cannot deadlock with them: with a command
    holding the run's lock, the reaper skips that run (expires nothing, locks nothing),
    the command then completes, and both finish without error."""
    run_id = ledger.start_run("test_review", {"expires_s": 60})
    assert drv.drive(run_id).status is RunStatus.WAITING
    asked = ledger.approvals(run_id=run_id)[0]
    later = sa.create_engine(ledger.url)
    clock.follow_engine(later, [timedelta(hours=2)])  # the reaper sees the approval expired
    swept: list[object] = []

    def reap() -> None:
        try:
            swept.append(RecoveryStore(later).sweep(stall_after_s=600))
        except Exception as exc:  # reported by the assertion below
            swept.append(exc)

    actor = ledger.acting_as("alice", Role.OPERATOR).actor
    try:
        with ledger.engine.begin() as conn:
            conn.execute(sa.text("SET LOCAL lock_timeout = '10s'"))
            operations.lock_run_txn(conn, run_id, actor)  # what both commands do first
            reaper = threading.Thread(target=reap)
            reaper.start()
            wait_for(lambda: swept or _lock_waits(ledger), timeout=10,
                     what="the reaper to finish its sweep or to block")
            if command == "cancel":
                operations.cancel_txn(conn, ledger.keys, actor, run_id, "no longer needed")
            else:
                operations.decide_approval_txn(conn, ledger.keys, actor, asked.id, approve=True,
                                               artifact_hash=asked.artifact_hash, comment=None)
        reaper.join(timeout=15)
    finally:
        later.dispose()
    assert len(swept) == 1 and not isinstance(swept[0], Exception), swept
    assert swept[0].waits.approvals_expired == 0  # type: ignore[attr-defined]
    decided = {"cancel": ApprovalStatus.INVALIDATED, "approve": ApprovalStatus.APPROVED}
    assert ledger.get_approval(asked.id).status is decided[command]


def _lock_waits(ledger: Ledger) -> bool:
    with ledger.engine.connect() as conn:
        return bool(conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()")).scalar_one())
