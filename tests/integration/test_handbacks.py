"""A run bound to a workflow version that no worker claiming it has (a rollback after newer
code moved it): steps executed in the test process (tests/support/driver.py) by "v1" and
"v2" workers against a real PostgreSQL, the database's clock moved past each backoff."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus
from ledger.audit import Role
from ledger.runs import Budgets
from tasks.executor import ReportKind
from tests.support import clock
from tests.support.driver import Driver, driver


@pytest.fixture()
def v1(ledger: Ledger) -> Iterator[Driver]:
    with driver(ledger, ["tests.versions.v1"]) as running:
        yield running


@pytest.fixture()
def v2(ledger: Ledger) -> Iterator[Driver]:
    with driver(ledger, ["tests.versions.v2"]) as running:
        yield running


def test_handback__a_run_no_live_worker_can_run_parks_without_spending_its_budget(
        ledger: Ledger, v1: Driver, v2: Driver) -> None:
    """Invariant: a run moved to v2, then delivered only to v1 workers (a rollback), is
    handed back without spending its attempt budget and, after ONWARD_HANDBACK_LIMIT (10)
    hand-backs in a row, parked no_worker_for_version with a message naming the version,
    leaving no outbox row; it is not claimed again (12 deliveries: 10 hand-backs, then
    stale). Continued once v2 workers are back, it completes within its attempt budget."""
    run_id = ledger.start_run("test_versioned", {}, budgets=Budgets(attempts=3))
    assert v2.drive(run_id).status is RunStatus.WAITING  # begin ran on v2: bound to v2
    assert ledger.signal(run_id, "go") is True
    kinds = []
    for delivery in range(1, 13):
        clock.set_on_store(v1.store, timedelta(minutes=delivery))  # past each backoff
        kinds.append(v1.step(run_id, 1).kind)
    assert kinds == [ReportKind.RELEASED] * 9 + [ReportKind.PARKED] + [ReportKind.STALE] * 2
    run = ledger.get_run(run_id)
    assert run is not None
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "no_worker_for_version")
    assert run.last_error is not None and "test_versioned v2" in run.last_error["message"]
    assert (run.attempts_total, run.attempt, run.handbacks) == (1, 0, 10)
    with ledger.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM onward.outbox WHERE run_id = :id"),
                            {"id": run_id}).scalar_one() == 0

    ledger.acting_as("olga", Role.OPERATOR).continue_run(run_id, "v2 workers are back")
    finished = v2.drive(run_id)
    assert finished.status is RunStatus.COMPLETED, finished.last_error
    assert finished.result is not None and finished.result["ran"] == ["begin@v2", "end@v2"]
    assert (finished.attempts_total, finished.handbacks) == (2, 0)


def test_handback__hand_backs_back_off_and_a_commit_resets_their_count(
        ledger: Ledger, v1: Driver, v2: Driver) -> None:
    """Invariant: each hand-back queues the step again later than the one before (1 s,
    2 s, 4 s by the database's clock), and a worker with the run's version that takes it
    meanwhile commits it and resets the count, with the attempts spent only by runs."""
    run_id = ledger.start_run("test_versioned", {})
    assert v2.drive(run_id).status is RunStatus.WAITING
    ledger.signal(run_id, "go")
    delays = []
    for delivery in range(1, 4):
        clock.set_on_store(v1.store, timedelta(minutes=delivery))
        assert v1.step(run_id, 1).kind is ReportKind.RELEASED
        with ledger.engine.connect() as conn:
            delays.append(conn.execute(sa.text(
                "SELECT extract(epoch FROM o.due_at - a.ended_at) FROM onward.outbox o "
                "JOIN onward.step_attempts a ON a.run_id = o.run_id "
                "WHERE o.run_id = :id AND a.outcome = 'released' "
                "ORDER BY a.lease_epoch DESC LIMIT 1"), {"id": run_id}).scalar_one())
    assert [round(float(d)) for d in delays] == [1, 2, 4]
    assert ledger.get_run(run_id).handbacks == 3  # type: ignore[union-attr]
    clock.set_on_store(v2.store, timedelta(minutes=10))
    finished = v2.drive(run_id)
    assert (finished.status, finished.handbacks, finished.attempts_total) == (
        RunStatus.COMPLETED, 0, 2)
