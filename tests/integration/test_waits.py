"""Waits (signals, approvals, timers) with steps executed in the test process
(tests/support/driver.py) against a real PostgreSQL: the interleavings that a real worker
meets only by bad luck, made to happen on purpose."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus
from ledger.recovery import RecoveryStore
from ledger.waits import signal_txn
from tasks import faults
from tests.support.cluster import wait_for
from tests.support.driver import Driver, driver_fixture

MODULES = ["tests.workflows_waits"]


drv = driver_fixture(MODULES)


@pytest.fixture()
def armed(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Arm fault points in this process (``armed(spec)``); disarmed after the test."""

    def arm(spec: str) -> None:
        monkeypatch.setenv("ONWARD_FAULTS", spec)
        faults.arm_from_env()

    yield arm
    monkeypatch.delenv("ONWARD_FAULTS", raising=False)
    faults.arm_from_env()


def _scalar(ledger: Ledger, sql: str, **params: object) -> object:
    with ledger.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def _claimed(ledger: Ledger, run_id: UUID) -> bool:
    return bool(_scalar(ledger, "SELECT count(*) FROM onward.step_attempts WHERE run_id = :id "
                                "AND outcome IS NULL", id=run_id))


def _commits_blocked_by(ledger: Ledger, holder: int) -> int:
    """Step commits waiting for a lock that backend ``holder`` holds. pg_stat_activity lists
    every database of the server: counting any blocked commit (another test's, a bench's)
    let the signal commit before this test's commit began, so the race never happened."""
    return int(_scalar(ledger, "SELECT count(*) FROM pg_stat_activity "  # type: ignore[arg-type]
                               "WHERE datname = current_database() "
                               "AND CAST(:holder AS int) = ANY(pg_blocking_pids(pid)) "
                               "AND query LIKE '%early_signal%'", holder=holder))


def test_signal__committed_while_the_wait_commits_is_delivered_by_the_reaper(
        drv: Driver, ledger: Ledger, armed: object) -> None:
    """Invariant: a signal is never lost, even when it commits while the commit that begins
    its wait is running (after that statement's snapshot, before it gets the run's row
    lock): the run is left waiting with the signal stored, and the reaper's next sweep
    consumes the signal for the waiting seq and queues the run, which then completes with
    the payload."""
    run_id = ledger.start_run("test_signal", {})
    armed("before_checkpoint_commit@wait_go:sleep=1")  # type: ignore[operator]
    stepping = threading.Thread(target=drv.step, args=(run_id, 0))
    stepping.start()
    wait_for(lambda: _claimed(ledger, run_id), timeout=10, what="the step to be claimed")
    with ledger.engine.begin() as conn:
        assert signal_txn(conn, ledger.keys, run_id, "go", {"n": 3}, max_bytes=1000,
                          max_depth=8) is False  # holds the run's row lock
        holder = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        wait_for(lambda: _commits_blocked_by(ledger, holder) == 1, timeout=10,
                 what="the waiting commit to block on the run's row lock")
    stepping.join(timeout=10)
    run = ledger.get_run(run_id)
    assert (run.status, run.seq, run.waiting_on) == (RunStatus.WAITING, 1, "signal:go")
    assert _scalar(ledger, "SELECT consumed_seq FROM onward.signals WHERE run_id = :id",
                   id=run_id) is None  # the race happened: stored, not consumed

    swept = RecoveryStore(ledger.engine).sweep(stall_after_s=60)

    assert swept.waits.signals_delivered == 1
    assert _scalar(ledger, "SELECT consumed_seq FROM onward.signals WHERE run_id = :id",
                   id=run_id) == 1
    assert _scalar(ledger, "SELECT count(*) FROM onward.outbox WHERE run_id = :id AND seq = 1",
                   id=run_id) == 1
    finished = drv.drive(run_id)
    assert (finished.status, finished.result) == (RunStatus.COMPLETED, {"payload": {"n": 3}})
    assert RecoveryStore(ledger.engine).sweep(stall_after_s=60).waits.signals_delivered == 0


def test_deadline__a_waiting_run_failed_by_its_deadline_leaves_no_pending_approval(
        drv: Driver, ledger: Ledger) -> None:
    """Invariant (docs/operating.md: a stopped run's approvals stop being pending, as cancel
    invalidates them): the reaper failing a waiting run past its deadline takes its approval
    off the inbox (invalidated, with the reason), so nobody is asked to decide for a dead run
    (found by review: it stayed pending until its own expiry)."""
    from datetime import timedelta

    from ledger.runs import Budgets
    from ledger.vocabulary import ApprovalStatus
    from tests.support.clock import follow_engine

    run_id = ledger.start_run("test_review", {"doc": "offer", "expires_s": 3600},
                              budgets=Budgets(deadline=timedelta(minutes=30)))
    assert drv.drive(run_id).status is RunStatus.WAITING
    follow_engine(ledger.engine, [timedelta(minutes=45)])  # deadline passed, approval not
    ledger.engine.dispose()
    RecoveryStore(ledger.engine).sweep(stall_after_s=3600)
    run = ledger.get_run(run_id)
    assert run is not None and run.status is RunStatus.FAILED
    assert run.last_error is not None and run.last_error["reason"] == "deadline_exceeded"
    admin = ledger.acting_as("root", "admin")
    assert [a.run_id for a in admin.approvals(status=ApprovalStatus.PENDING)] == []
    (approval,) = admin.approvals(run_id=run_id, status=None)
    assert approval.status is ApprovalStatus.INVALIDATED
    assert approval.comment is not None and "deadline_exceeded" in approval.comment
