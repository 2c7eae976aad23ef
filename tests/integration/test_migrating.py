"""A deploy with a state migration meets runs in flight (docs/versioning.md): steps executed
in the test process (tests/support/driver.py) by "v1 workers", then by "v2 workers", against
a real PostgreSQL. What the outside world saw is counted: CRM objects by key, paid model
calls."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus
from ledger.vocabulary import ApprovalStatus, Role
from tasks.executor import ReportKind
from tests.support import clock, reads
from tests.support.driver import Driver, driver
from tests.versions.migrating import crm_objects
from tests.workflows_ops import calls

V1 = ["tests.versions.migrating_v1"]
V2 = ["tests.versions.migrating_v2"]
V2_WITHOUT_MIGRATION = ["tests.versions.migrating_v2_incomplete"]


@pytest.fixture()
def model_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ONWARD_TEST_CRM_CALLS", str(tmp_path / "crm.log"))
    monkeypatch.setenv("ONWARD_FAKE_LLM_LOG", str(tmp_path / "llm.log"))
    return tmp_path / "llm.log"


@pytest.fixture()
def ops(ledger: Ledger) -> Ledger:
    return ledger.acting_as("olga", Role.OPERATOR)


@pytest.fixture()
def v1(ledger: Ledger, model_log: Path) -> Iterator[Driver]:
    with driver(ledger, V1) as running:
        yield running


@pytest.fixture()
def v2(ledger: Ledger, model_log: Path) -> Iterator[Driver]:
    with driver(ledger, V2) as running:
        yield running


def _rows(ledger: Ledger, sql: str, run_id: UUID) -> list[Any]:
    with ledger.engine.connect() as conn:
        return list(conn.execute(sa.text(sql), {"id": run_id}).all())


def _crashed_after_the_crm_call(ledger: Ledger, v1: Driver) -> UUID:
    """A v1 run whose ``send`` (seq 1) asked the model, created the offer, then raised."""
    run_id = ledger.start_run("test_migrating", {"customer": "c-7"})
    assert v1.step(run_id, 0).kind is ReportKind.COMMITTED
    assert v1.step(run_id, 1).kind is ReportKind.RETRY
    assert len(crm_objects()) == 1
    return run_id


def _kept_its_command_ids(ledger: Ledger, run_id: UUID, model_log: Path) -> None:
    """One CRM object, one effect row and one paid model call, all named by seq 1."""
    run = ledger.get_run(run_id)
    assert run is not None and run.status is RunStatus.COMPLETED, run
    assert (run.seq, run.workflow_version, run.state_schema_version) == (2, 2, 2)
    assert len(crm_objects()) == 1
    assert len(calls(model_log)) == 1
    effects = _rows(ledger, "SELECT command_id, effect_id, status FROM onward.effects "
                            "WHERE run_id = :id", run_id)
    assert [(e.command_id, e.status) for e in effects] == [("send@1#2", "completed")]
    assert crm_objects() == [effects[0].effect_id]
    evidence = _rows(ledger, "SELECT command_id FROM onward.evidence WHERE run_id = :id",
                     run_id)
    assert [e.command_id for e in evidence] == ["send@1#1"]
    assert run.result is not None and run.result["offer"] == f"offer_{crm_objects()[0][:12]}"
    assert reads.checkpoint_outcomes(ledger.engine, run_id) == ["start", "goto", "finish"]
    assert ledger.verify_run(run_id) == []


def test_migration__a_retried_step_keeps_the_command_ids_of_its_seq(
        ledger: Ledger, v1: Driver, v2: Driver, model_log: Path) -> None:
    """Invariant: a migration never renumbers a step. A step that made its model call and
    its CRM call under v1 and then raised is retried by v2 after a state migration at the
    same seq, with the same command ids: the recorded model answer is reused (one paid
    call), the recorded effect is found (one CRM object, one key), and the checkpoint the
    step commits records the migration under its MAC."""
    run_id = _crashed_after_the_crm_call(ledger, v1)
    assert v2.drive(run_id).status is RunStatus.COMPLETED
    _kept_its_command_ids(ledger, run_id, model_log)
    migrated = ledger.checkpoints(run_id)[2].compatibility.migrated_from
    assert migrated is not None
    assert (migrated.workflow_version, migrated.state_schema_version) == (1, 1)


def test_migration__parked_run_continued_after_the_migration_ships_keeps_its_command_ids(
        ledger: Ledger, ops: Ledger, v1: Driver, v2: Driver, model_log: Path) -> None:
    """Invariant: a run parked because the deployed code had no migration path, continued
    once the migration ships, runs its step at the seq it was parked at, with that seq's
    command ids: its recorded effect and model answer are found, nothing is sent twice."""
    run_id = _crashed_after_the_crm_call(ledger, v1)
    with driver(ledger, V2_WITHOUT_MIGRATION) as broken:
        assert broken.step(run_id, 1).kind is ReportKind.PARKED
    parked = ledger.get_run(run_id)
    assert parked is not None and parked.parked_reason == "incompatible_version"
    ops.continue_run(run_id, "the migration from schema 1 shipped")
    assert v2.drive(run_id).status is RunStatus.COMPLETED
    _kept_its_command_ids(ledger, run_id, model_log)


def _waiting_under_v1(ledger: Ledger, v1: Driver, wait: str) -> UUID:
    run_id = ledger.start_run("test_migrating", {"customer": "c-9", "wait": wait})
    run = v1.drive(run_id)
    assert (run.status, run.seq, run.workflow_version) == (RunStatus.WAITING, 2, 1)
    return run_id


def test_migration__a_signal_wait_resumed_by_newer_code_keeps_its_signal(
        ledger: Ledger, v1: Driver, v2: Driver, model_log: Path) -> None:
    """Invariant: migrating a run that resumes from a signal wait keeps the wait's meaning:
    the step after the wait sees the signal's payload (ctx.signal) under the new code."""
    run_id = _waiting_under_v1(ledger, v1, "signal")
    assert ledger.signal(run_id, "go", {"n": 5}) is True
    run = v2.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    assert run.result is not None
    assert (run.result["signal"], run.result["version"], run.result["customer"]) == (
        {"n": 5}, 2, "c-9")
    assert reads.checkpoint_outcomes(ledger.engine, run_id) == ["start", "goto", "wait",
                                                                "finish"]


def test_migration__an_approval_wait_resumed_by_newer_code_keeps_its_decision(
        ledger: Ledger, ops: Ledger, v1: Driver, v2: Driver, model_log: Path) -> None:
    """Invariant: migrating a run that resumes from an approval keeps the wait's meaning:
    the approved step sees the decision (ctx.decision) under the new code."""
    run_id = _waiting_under_v1(ledger, v1, "approval")
    asked = ledger.approvals(run_id=run_id, status=ApprovalStatus.PENDING)[0]
    ops.approve(asked.id, artifact_hash=asked.artifact_hash)
    run = v2.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    assert run.result is not None and run.result["decided_by"] == "olga"


def test_migration__an_expired_approval_is_rechecked_before_migrating(
        ledger: Ledger, ops: Ledger, v1: Driver, v2: Driver, model_log: Path) -> None:
    """Invariant: the approval a resumed step acts on is re-checked (status, expiry,
    artifact) before any migration: approved, then expired by the database's clock before
    newer code claims the step, it fails the run approval_expired; the approved step does
    not run (no model call) and no checkpoint is written."""
    run_id = _waiting_under_v1(ledger, v1, "approval")
    asked = ledger.approvals(run_id=run_id, status=ApprovalStatus.PENDING)[0]
    ops.approve(asked.id, artifact_hash=asked.artifact_hash)
    clock.set_on_store(v2.store, timedelta(hours=1))  # past the 10-minute expiry
    run = v2.drive(run_id)
    assert run.status is RunStatus.FAILED
    assert run.last_error is not None and run.last_error["reason"] == "approval_expired"
    assert calls(model_log) == []
    assert reads.checkpoint_outcomes(ledger.engine, run_id) == ["start", "goto", "wait"]


def test_migration__evidence_replay_of_a_migrated_run_lines_up_with_its_parent(
        ledger: Ledger, ops: Ledger, v1: Driver, v2: Driver, model_log: Path) -> None:
    """Invariant: an evidence replay of a run that was migrated mid-way (here while it
    waited) finds its parent's record for every call: the replay from a v1 checkpoint, run
    and migrated by the new code, reaches each step and wait at the seq the parent did,
    follows the parent's signal and completes with the parent's result, calling nothing."""
    run_id = _waiting_under_v1(ledger, v1, "signal")
    ledger.signal(run_id, "go", {"n": 1})
    parent = v2.drive(run_id)
    assert parent.status is RunStatus.COMPLETED
    paid = len(calls(model_log))
    launched = ops.replay(run_id, 1, "evidence", "audit the migrated run")
    replay = v2.drive(launched.run_id)
    assert replay.status is RunStatus.COMPLETED, replay.last_error
    assert replay.result == parent.result
    assert len(calls(model_log)) == paid == 1


def test_first_claim__input_of_an_older_schema_is_handed_back_unbound_for_its_version(
        ledger: Ledger, v1: Driver, v2: Driver) -> None:
    """Invariant: a new run started for v1 (its input fits v1's model, schema 1) and first
    claimed by a v2 worker (schema 2, whose model rejects it) is not parked invalid_state
    under a version it was never meant for: the claim's binding is undone and the step handed
    back unspent, so the dispatcher routes it to the workflow's queue again, and a v1 worker
    binds and runs it: its first step commits on v1, with the attempt it spent alone."""
    run_id = ledger.start_run("test_migrating", {"customer": "c-9"})
    assert v2.step(run_id, 0).kind is ReportKind.RELEASED
    handed = ledger.get_run(run_id)
    assert handed is not None
    assert (handed.status, handed.seq, handed.workflow_version, handed.state_schema_version,
            handed.handbacks, handed.attempts_total) == (RunStatus.RUNNING, 0, None, None, 1, 0)
    assert handed.last_error is not None and handed.last_error["type"] == "InputNotAccepted"
    assert "test_migrating v2" in handed.last_error["message"]
    assert ledger.verify_run(run_id) == []

    clock.set_on_store(v1.store, timedelta(minutes=1))  # past the hand-back's backoff
    assert v1.step(run_id, 0).kind is ReportKind.COMMITTED
    moved = ledger.get_run(run_id)
    assert moved is not None
    assert (moved.seq, moved.workflow_version, moved.state_schema_version, moved.handbacks,
            moved.attempts_total) == (1, 1, 1, 0, 1)
    assert ledger.verify_run(run_id) == []


def test_first_claim__input_no_version_accepts_parks_naming_the_remedy_and_continues(
        ledger: Ledger, ops: Ledger, v1: Driver, v2: Driver) -> None:
    """Invariant: a new run whose input only v1 accepts, met only by v2 workers (v1 retired
    while it was queued), is handed back ONWARD_HANDBACK_LIMIT (10) times, then parked
    no_worker_for_version (not invalid_state) with a message saying which version rejected
    the input and what to do, still bound to no version and spending no attempt; once a v1
    worker is deployed, `runs continue` resumes it there."""
    run_id = ledger.start_run("test_migrating", {"customer": "c-9"})
    kinds = []
    for delivery in range(1, 12):
        clock.set_on_store(v2.store, timedelta(minutes=delivery))  # past each backoff
        kinds.append(v2.step(run_id, 0).kind)
    assert kinds == [ReportKind.RELEASED] * 9 + [ReportKind.PARKED] + [ReportKind.STALE]
    parked = ledger.get_run(run_id)
    assert parked is not None
    assert (parked.status, parked.parked_reason) == (RunStatus.NEEDS_REVIEW,
                                                     "no_worker_for_version")
    assert (parked.workflow_version, parked.attempts_total, parked.handbacks) == (None, 0, 10)
    assert parked.last_error is not None
    message = parked.last_error["message"]
    assert "accepts the run's input" in message and "test_migrating v2" in message, message
    assert f"onward runs continue {run_id}" in message, message

    ops.continue_run(run_id, "v1 workers are back")
    assert v1.step(run_id, 0).kind is ReportKind.COMMITTED
    moved = ledger.get_run(run_id)
    assert moved is not None and (moved.seq, moved.workflow_version) == (1, 1)
    assert ledger.verify_run(run_id) == []


def test_first_claim__a_worker_with_both_versions_runs_the_input_on_the_one_it_fits(
        ledger: Ledger, model_log: Path) -> None:
    """Invariant: one worker with v1 and v2 side by side (both modules in ONWARD_WORKFLOWS)
    binds a new run to v2, its newest; when v2's model rejects the input and v1's accepts
    it, the step is handed back bound to v1 (no attempt spent), and the same worker then
    runs it on v1, instead of handing it back unbound to itself until it is parked."""
    run_id = ledger.start_run("test_migrating", {"customer": "c-9"})
    with driver(ledger, V1 + V2) as both:
        assert both.step(run_id, 0).kind is ReportKind.RELEASED
        handed = ledger.get_run(run_id)
        assert handed is not None
        assert (handed.workflow_version, handed.state_schema_version, handed.handbacks,
                handed.attempts_total) == (1, 1, 1, 0)
        assert handed.last_error is not None and "bound to v1" in handed.last_error["message"]
        clock.set_on_store(both.store, timedelta(minutes=1))  # past the hand-back's backoff
        assert both.step(run_id, 0).kind is ReportKind.COMMITTED
    moved = ledger.get_run(run_id)
    assert moved is not None
    assert (moved.seq, moved.workflow_version, moved.handbacks, moved.attempts_total) == (
        1, 1, 0, 1)
    assert ledger.verify_run(run_id) == []
