"""Migrations on a populated ledger: runs stopped at every kind of place (waiting on an
approval, on a signal with the signal already sent, decided but not resumed, failed,
queued, leased by a worker that never ran the step, a step failed with its effect pending
or with its effect completed and not committed, completed), their effects, evidence,
signals and step attempts of several months go back to an older revision and forward to
head again. What the migrations copy or re-sign (0037's signal MACs, 0038's copy of
step_attempts into month partitions, 0041's approval decisions, 0047's recipients) must
come out verifying, and every run must then finish with the real
executor without calling anything twice."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus
from ledger.db import HEAD_REVISION, current_revision
from ledger.exceptions import InvalidInput
from ledger.migrate import downgrade, upgrade
from ledger.steps import Claim
from ledger.vocabulary import Role
from tasks import faults
from tasks.waiting import artifact_hash
from tests.support.corpus import OPS_MODULES, ops_driver
from tests.support.driver import Driver
from tests.workflows_ops import calls

MODULES = ["tests.workflows_corpus", *OPS_MODULES]


@pytest.fixture()
def drv(ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    with ops_driver(ledger, tmp_path / "tool.log", monkeypatch, MODULES) as running:
        yield running


def _attempt_rows(engine: sa.engine.Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.text(
            "SELECT run_id, lease_epoch, seq, attempt, step, worker, started_at, ended_at, "
            "outcome FROM onward.step_attempts ORDER BY run_id, lease_epoch"))]


def _partitions(engine: sa.engine.Engine) -> dict[str, int]:
    """Each partition of step_attempts and how many rows it holds."""
    with engine.connect() as conn:
        names = conn.execute(sa.text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'onward.step_attempts'::regclass")).scalars().all()
        return {name: conn.execute(sa.text(f"SELECT count(*) FROM onward.{name}")).scalar_one()
                for name in names}


def _stopped_runs(drv: Driver, monkeypatch: pytest.MonkeyPatch) -> dict[str, UUID]:
    ledger = drv.ledger
    approver = ledger.acting_as("ann", Role.APPROVER)
    runs: dict[str, UUID] = {}

    runs["completed"] = ledger.start_run("test_ops_notes", {"topic": "done"})
    assert drv.drive(runs["completed"]).status is RunStatus.COMPLETED

    runs["awaiting_approval"] = ledger.start_run("test_ops_notes",
                                                 {"topic": "waits", "approve": True})
    assert drv.drive(runs["awaiting_approval"]).status is RunStatus.WAITING

    runs["approved"] = ledger.start_run("test_ops_notes", {"topic": "decided", "approve": True})
    assert drv.drive(runs["approved"]).status is RunStatus.WAITING
    approval = ledger.approvals(run_id=runs["approved"])[0]
    approver.approve(approval.id, artifact_hash=artifact_hash(approval.artifact),
                     comment="ship it")

    runs["signalled"] = ledger.start_run("test_corpus_flow", {"sku": "chair"})
    assert drv.drive(runs["signalled"]).status is RunStatus.WAITING
    assert ledger.signal(runs["signalled"], "go", {"by": "sam"})

    runs["awaiting_signal"] = ledger.start_run("test_corpus_flow", {"sku": "desk"})
    assert drv.drive(runs["awaiting_signal"]).status is RunStatus.WAITING

    monkeypatch.setenv("ONWARD_TEST_OPS_BROKEN", "1")
    runs["failed"] = ledger.start_run("test_ops_fragile", {})
    assert drv.drive(runs["failed"]).status is RunStatus.FAILED
    monkeypatch.delenv("ONWARD_TEST_OPS_BROKEN")

    runs["queued"] = ledger.start_run("test_ops_notes", {"topic": "queued"})

    runs["leased"] = ledger.start_run("test_ops_notes", {"topic": "leased"})
    claimed = drv.store.claim(runs["leased"], 0, "old-worker:1")  # and never run
    assert isinstance(claimed, Claim), claimed

    # the post step failed at a fault point: its effect pending (the provider not called
    # yet), or completed (called, the step not committed); each is retried after the upgrade
    for name, fault in (("effect_pending", "after_effect_pending"),
                        ("effect_sent", "after_effect_recorded")):
        monkeypatch.setenv("ONWARD_FAULTS", f"{fault}@post:raise:once")
        faults.arm_from_env()
        runs[name] = ledger.start_run("test_ops_notes", {"topic": name})
        for seq in range(3):  # summarize, review, post (fails at the fault)
            drv.step(runs[name], seq)
        assert ledger.get_run(runs[name]).seq == 2
    monkeypatch.delenv("ONWARD_FAULTS")
    faults.arm_from_env()
    with ledger.engine.connect() as conn:
        statuses = conn.execute(sa.text(
            "SELECT e.run_id, e.status FROM onward.effects e WHERE e.run_id IN (:a, :b) "
            "AND e.effect_type = 'test.publish'"),
            {"a": runs["effect_pending"], "b": runs["effect_sent"]}).all()
    assert sorted((str(s) for _, s in statuses)) == ["completed", "pending"], statuses
    return runs


def test_migrations__a_populated_ledger_goes_back_and_forward_and_its_runs_finish(
        drv: Driver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Invariant: downgrading a ledger full of runs to 0036 and upgrading it to head again
    keeps every step attempt (with its month: past months, this month, a month with no
    partition yet) and re-signs what 0037 and 0041 signed, so that every run verifies; each
    run then reaches its end with the real executor, and each effect was called once."""
    ledger = drv.ledger
    engine = ledger.engine
    runs = _stopped_runs(drv, monkeypatch)
    with engine.begin() as conn:  # attempts of two months ago and of a month far ahead
        conn.execute(sa.text(
            "UPDATE onward.step_attempts SET started_at = started_at - interval '2 months', "
            "ended_at = ended_at - interval '2 months' WHERE run_id = :id"),
            {"id": runs["completed"]})
        conn.execute(sa.text(
            "UPDATE onward.step_attempts SET started_at = started_at + interval '9 months', "
            "ended_at = ended_at + interval '9 months' WHERE run_id = :id"),
            {"id": runs["failed"]})
    attempts = _attempt_rows(engine)
    called = calls(tmp_path / "tool.log")
    # the notes runs' log lines (five), the publish of the completed and effect_sent runs
    assert len(called) == 7, called
    before = {name: ledger.verify_run(run_id) for name, run_id in runs.items()}
    assert before == {name: [] for name in runs}

    downgrade(engine, "0036")
    assert current_revision(engine) == "0036"
    upgrade(engine)
    assert current_revision(engine) == HEAD_REVISION

    assert _attempt_rows(engine) == attempts
    held = _partitions(engine)
    assert sum(held.values()) == len(attempts) and held.get("step_attempts_default", 0) == 0
    after = {name: ledger.verify_run(run_id) for name, run_id in runs.items()}
    assert after == {name: [] for name in runs}, after

    approval = ledger.approvals(run_id=runs["awaiting_approval"])[0]
    ledger.acting_as("ann", Role.APPROVER).approve(
        approval.id, artifact_hash=artifact_hash(approval.artifact))
    assert ledger.signal(runs["awaiting_signal"], "go", {"by": "sue"})
    ledger.continue_run(runs["failed"], "the template is fixed")
    with engine.begin() as conn:  # the old worker that held the lease is gone
        conn.execute(sa.text("UPDATE onward.runs SET lease_expires_at = onward.now() "
                             "- interval '1 second' WHERE id = :id"), {"id": runs["leased"]})
    for name, run_id in runs.items():
        run = drv.drive(run_id)
        assert run.status is RunStatus.COMPLETED, (name, run)
        assert ledger.verify_run(run_id) == [], name

    every = calls(tmp_path / "tool.log")
    keys = [line.split("\t")[1] for line in every]
    assert len(keys) == len(set(keys)), every
    assert every[:len(called)] == called


def test_migrations__a_signing_migration_refuses_a_key_the_ledger_was_not_signed_with(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a migration that signs existing rows (0047: effects' recipients) run
    without the ledger's checkpoint key (a deploy job missing ONWARD_CHECKPOINT_KEY, which
    then makes a development key of its own) is refused, the ledger left at its revision,
    instead of signing every recipient with a key no process has (each then failing
    verification); with the right key it signs them and every run verifies."""
    ledger = drv.ledger
    run_id = ledger.start_run("test_ops_notes", {"topic": "keys"})
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    downgrade(ledger.engine, "0046")

    key = os.environ["ONWARD_CHECKPOINT_KEY"]
    monkeypatch.setenv("ONWARD_CHECKPOINT_KEY", "not-the-ledgers-key")
    with pytest.raises(InvalidInput, match="no recent run head of this ledger verifies"):
        upgrade(ledger.engine)
    assert current_revision(ledger.engine) == "0046"

    monkeypatch.setenv("ONWARD_CHECKPOINT_KEY", key)
    upgrade(ledger.engine)
    assert current_revision(ledger.engine) == HEAD_REVISION
    assert ledger.verify_run(run_id) == []
