"""A run bound to a workflow version that no worker claiming it has (a rollback after newer
code moved it), and a run of a workflow the worker claiming it lacks altogether (its own
workers down for a deploy): steps executed in the test process (tests/support/driver.py)
by "v1", "v2" and "other" workers against a real PostgreSQL, the database's clock moved
past each backoff."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus
from ledger.fleet import FleetStore
from ledger.outbox import OutboxStore
from ledger.runs import Budgets
from ledger.steps import Stale
from ledger.vocabulary import Role
from tasks.executor import ReportKind
from tasks.routing import route, worker_queues
from tests.support import clock
from tests.support.driver import Driver, driver
from workers.settings import WorkerSettings


@pytest.fixture()
def v1(ledger: Ledger) -> Iterator[Driver]:
    with driver(ledger, ["tests.versions.v1"]) as running:
        yield running


@pytest.fixture()
def v2(ledger: Ledger) -> Iterator[Driver]:
    with driver(ledger, ["tests.versions.v2"]) as running:
        yield running


@pytest.fixture()
def other(ledger: Ledger) -> Iterator[Driver]:
    """A worker of another workflow only (test_first_step): no test_versioned at all."""
    with driver(ledger, ["tests.versions.first_step_v1"]) as running:
        yield running


def _last_delay(ledger: Ledger, run_id: object) -> float:
    """Seconds between the latest hand-back and the step's queued time (the backoff)."""
    with ledger.engine.connect() as conn:
        return float(conn.execute(sa.text(
            "SELECT extract(epoch FROM o.due_at - a.ended_at) FROM onward.outbox o "
            "JOIN onward.step_attempts a ON a.run_id = o.run_id "
            "WHERE o.run_id = :id AND a.outcome = 'released' "
            "ORDER BY a.lease_epoch DESC LIMIT 1"), {"id": run_id}).scalar_one())


def test_handback__a_run_of_a_workflow_no_worker_has_parks_without_spending_its_budget(
        ledger: Ledger, other: Driver, v1: Driver) -> None:
    """Invariant: a run of test_versioned delivered only to workers without that workflow
    (its own workers down for a deploy) is handed back without spending its attempt budget,
    each time later (1 s, 2 s, 4 s ... capped), and, after ONWARD_HANDBACK_LIMIT (10)
    hand-backs in a row, parked no_worker_for_version with a message that names the
    workflow and says what to do, leaving no outbox row. Continued once a worker with the
    workflow is back, it runs to completion."""
    run_id = ledger.start_run("test_versioned", {}, budgets=Budgets(attempts=3))
    kinds, delays = [], []
    for delivery in range(1, 13):
        clock.set_on_store(other.store, timedelta(minutes=delivery))  # past each backoff
        kinds.append(other.step(run_id, 0).kind)
        if kinds[-1] is ReportKind.RELEASED:
            delays.append(round(_last_delay(ledger, run_id)))
    assert kinds == [ReportKind.RELEASED] * 9 + [ReportKind.PARKED] + [ReportKind.STALE] * 2
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30, 30]
    run = ledger.get_run(run_id)
    assert run is not None
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "no_worker_for_version")
    assert (run.attempts_total, run.attempt, run.handbacks) == (0, 0, 10)
    assert run.last_error is not None
    message = run.last_error["message"]
    assert "no worker with workflow test_versioned" in message, message
    assert "ONWARD_WORKFLOWS" in message and f"onward runs continue {run_id}" in message
    with ledger.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM onward.outbox WHERE run_id = :id"),
                            {"id": run_id}).scalar_one() == 0

    ledger.acting_as("olga", Role.OPERATOR).continue_run(run_id, "test_versioned is back")
    assert v1.drive(run_id).status is RunStatus.WAITING
    ledger.signal(run_id, "go")
    finished = v1.drive(run_id)
    assert finished.status is RunStatus.COMPLETED, finished.last_error
    assert finished.result is not None and finished.result["ran"] == ["begin@v1", "end@v1"]


def test_handback__a_worker_of_the_workflow_back_before_the_limit_runs_the_run(
        ledger: Ledger, settings: WorkerSettings, other: Driver, v1: Driver) -> None:
    """Invariant: a run of a workflow whose workers are down is routed to the base queue,
    where other workflows' workers hand it back (no attempt spent); once a worker with the
    workflow advertises, the re-sent step is routed to the workflow's own queue, and that
    worker runs it: its commit resets the hand-back count, and the run completes with only
    its own steps' attempts spent."""
    run_id = ledger.start_run("test_versioned", {}, budgets=Budgets(attempts=3))
    base, fleet = settings.queue, FleetStore(ledger.url)

    def routed() -> str:
        """The queue the dispatcher sends the run's re-sent step to (workers/dispatcher.py)."""
        bound = ledger.get_run(run_id)
        assert bound is not None
        outbox = OutboxStore(ledger.url, grace_s=settings.outbox_grace_s,
                             republish_s=settings.outbox_republish_s,
                             republish_max_s=settings.outbox_republish_max_s)
        try:
            live = outbox.live_queue_starts(within_s=settings.worker_queue_ttl_s)
        finally:
            outbox.close()
        return route(base, bound.workflow, bound.workflow_version, live)

    fleet.advertise(None, [(q, w, v, None) for q, w, v in worker_queues(base, other.registry)])
    for delivery in range(1, 5):
        clock.set_on_store(other.store, timedelta(minutes=delivery))
        assert other.step(run_id, 0).kind is ReportKind.RELEASED
        assert routed() == base  # no worker of test_versioned advertises its queue
    handed = ledger.get_run(run_id)
    assert handed is not None and (handed.handbacks, handed.attempts_total) == (4, 0)

    fleet.advertise(None, [(q, w, v, None) for q, w, v in worker_queues(base, v1.registry)])
    assert routed() == f"{base}.test_versioned"  # the workflow's queue: its workers only
    clock.set_on_store(v1.store, timedelta(minutes=10))
    waiting = v1.drive(run_id)
    assert (waiting.status, waiting.handbacks, waiting.attempts_total) == (
        RunStatus.WAITING, 0, 1)
    ledger.signal(run_id, "go")
    finished = v1.drive(run_id)
    assert (finished.status, finished.handbacks, finished.attempts_total) == (
        RunStatus.COMPLETED, 0, 2)


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
        delays.append(round(_last_delay(ledger, run_id)))
    assert delays == [1, 2, 4]
    assert ledger.get_run(run_id).handbacks == 3  # type: ignore[union-attr]
    clock.set_on_store(v2.store, timedelta(minutes=10))
    finished = v2.drive(run_id)
    assert (finished.status, finished.handbacks, finished.attempts_total) == (
        RunStatus.COMPLETED, 0, 2)


@pytest.fixture()
def paying() -> Iterator[list[dict[str, object]]]:
    from tests.versions import first_step

    first_step.OBJECTS.clear()
    first_step.LOSE_NEXT_ANSWER.clear()
    yield first_step.OBJECTS
    first_step.OBJECTS.clear()
    first_step.LOSE_NEXT_ANSWER.clear()


def test_first_step__a_retry_runs_on_the_code_that_began_it(
        ledger: Ledger, paying: list[dict[str, object]]) -> None:
    """Invariant (docs/versioning.md; at most one provider object per effect): a run binds
    to the version of the code that first claims it, in the claim itself. v2 begins the
    first step, pays, and the answer is lost; the retry delivered to a v1 worker (rolling
    deploy; v1 names the payment by another key) is handed back, not run, and v2's retry
    finds its payment by lookup: one provider object, the run completed on v2."""
    from tests.versions import first_step

    run_id = ledger.start_run("test_first_step", {"amount": 70})
    first_step.LOSE_NEXT_ANSWER.append(True)
    with driver(ledger, ["tests.versions.first_step_v2"]) as v2, \
            driver(ledger, ["tests.versions.first_step_v1"]) as v1:
        assert v2.step(run_id, 0).kind is ReportKind.RETRY
        assert len(paying) == 1
        bound = ledger.get_run(run_id)
        retried_by_v1 = v1.step(run_id, 0).kind
        assert len(paying) == 1, (f"v1 ran the retry ({retried_by_v1.value}): payments "
                                  f"under keys {[o['key'] for o in paying]}")
        assert retried_by_v1 is ReportKind.RELEASED  # handed back: v1 lacks v2
        assert bound is not None and (bound.seq, bound.workflow_version) == (0, 2)
        clock.set_on_store(v2.store, timedelta(minutes=1))  # past the hand-back's backoff
        finished = v2.drive(run_id)
    assert len(paying) == 1, [o["key"] for o in paying]
    assert finished.status is RunStatus.COMPLETED, finished.last_error
    assert finished.result == {"paid": paying[0]["id"], "version": 2}
    assert (finished.workflow_version, finished.handbacks) == (2, 0)
    [effect] = ledger.effects(run_id)
    assert effect.status.value == "completed"
    assert ledger.verify_run(run_id) == []


def test_first_step__an_unbound_run_is_bound_by_its_first_claim_and_still_verifies(
        ledger: Ledger, v1: Driver) -> None:
    """Invariant: the binding is made by the claim statement (no extra round trip) and is
    consistent with the run's signed start: a run at seq 0 bound by a claim whose step has
    not committed verifies, and a v1 worker runs it (the same version) after its retry."""
    run_id = ledger.start_run("test_versioned", {})
    assert ledger.get_run(run_id).workflow_version is None  # type: ignore[union-attr]
    claim = v1.store.claim(run_id, 0, "w:1", bind={"test_versioned": [1, 1]})
    assert not isinstance(claim, Stale)
    assert (claim.workflow_version, claim.state_schema_version) == (1, 1)
    assert v1.store.release(claim, {"type": "Test", "message": "let go"})
    assert ledger.verify_run(run_id) == []
    assert v1.drive(run_id).status is RunStatus.WAITING


def test_restore__a_model_changed_under_the_same_version_parks_naming_the_remedy(
        ledger: Ledger, v1: Driver) -> None:
    """Invariant: a worker whose v1 state model changed incompatibly without a new version
    or state schema (tests/versions/v1_changed.py) meets a run v1 moved to seq 1: the step
    does not run, the run is parked invalid_state at seq 1 with a message that names the
    version and schema, says the model changed, and says what to do (a new
    state_schema_version with a migration, or the model restored, then continue)."""
    run_id = ledger.start_run("test_versioned", {"name": "grace"})
    assert v1.drive(run_id).status is RunStatus.WAITING
    ledger.signal(run_id, "go")
    with driver(ledger, ["tests.versions.v1_changed"]) as changed:
        assert changed.step(run_id, 1).kind is ReportKind.PARKED
    run = ledger.get_run(run_id)
    assert run is not None
    assert (run.status, run.parked_reason, run.seq) == (RunStatus.NEEDS_REVIEW,
                                                        "invalid_state", 1)
    assert run.last_error is not None
    message = run.last_error["message"]
    assert "test_versioned v1" in message and "schema 1" in message, message
    assert "state_schema_version" in message and "migration" in message, message
    assert f"onward runs continue {run_id}" in message, message


def test_restore__a_run_of_an_older_version_met_only_by_newer_code_parks_naming_the_remedy(
        ledger: Ledger, v1: Driver, v2: Driver) -> None:
    """Invariant: a run v1 moved to seq 1, delivered only to a v2 worker (v1 retired; v2
    declares no compatibility and has no migration), is not run on v2: it is parked
    incompatible_version at seq 1, still bound to v1, with a message that names both
    versions and what to do (deploy v1 again, or a migration or compatible_with, then
    continue); continued once a v1 worker is back, it completes on v1."""
    run_id = ledger.start_run("test_versioned", {})
    assert v1.drive(run_id).status is RunStatus.WAITING
    ledger.signal(run_id, "go")
    assert v2.step(run_id, 1).kind is ReportKind.PARKED
    run = ledger.get_run(run_id)
    assert run is not None
    assert (run.status, run.parked_reason, run.seq, run.workflow_version) == (
        RunStatus.NEEDS_REVIEW, "incompatible_version", 1, 1)
    assert run.last_error is not None
    message = run.last_error["message"]
    assert "test_versioned v1" in message and "v[2]" in message, message
    assert "compatible_with" in message and "migration" in message, message
    assert f"onward runs continue {run_id}" in message, message

    ledger.acting_as("olga", Role.OPERATOR).continue_run(run_id, "v1 workers are back")
    finished = v1.drive(run_id)
    assert finished.status is RunStatus.COMPLETED, finished.last_error
    assert finished.result is not None and finished.result["ran"] == ["begin@v1", "end@v1"]
