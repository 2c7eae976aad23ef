"""Replays and branches copy only what verifies, and never let a person approve one thing
while the run acts on another (docs/design.md sections 6 and 8, invariants 5 and 6). Steps run
in the test process (tests/support/driver.py) against a real PostgreSQL; the outside world
is counted by the local tool's and the fake model's call logs."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus
from ledger.exceptions import IntegrityViolation, OperationRefused
from tests.integration.test_operations import (  # noqa: F401 - fixtures
    audit_actions,
    drv,
    ledger_ops,
    logs,
    ops,
    outside,
)
from tests.support import reads
from tests.support.driver import Driver


def waiting_for_approval(drv: Driver, ops: Ledger, **state: object) -> UUID:  # noqa: F811
    run_id = ops.start_run("test_ops_notes", {"approve": True, **state})
    assert drv.drive(run_id).status is RunStatus.WAITING
    return run_id


def new_runs(ops: Ledger) -> int:  # noqa: F811
    with ops.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM onward.runs")).scalar_one())


def test_branch__state_patch_at_an_approval_wait_is_refused(
        drv: Driver, ops: Ledger, logs: dict[str, Path]) -> None:  # noqa: F811
    """Invariant: a branch from a checkpoint that waits for approval would ask the approver
    about the artifact the parent built from the unpatched state, then act on the patched
    state. A state patch there is refused (audited, nothing created, nothing called), with
    the checkpoint to branch from instead; branching from the asking step asks again, about
    an artifact built from the patched state."""
    parent = waiting_for_approval(drv, ops, summary="pay 100")
    [asked] = ops.approvals(run_id=parent)
    patch = [{"op": "replace", "path": "/summary", "value": "pay 1,000,000"}]
    runs_before, seen = new_runs(ops), outside(logs)

    with pytest.raises(OperationRefused, match=rf"branch from checkpoint {asked.seq - 1}"):
        ops.branch(parent, asked.seq, patch, "raise the amount", allow_irreversible=True)

    assert new_runs(ops) == runs_before
    assert outside(logs) == seen
    assert audit_actions(ops, parent) == [("branch", "refused")]
    launched = ops.branch(parent, asked.seq - 1, patch, "raise the amount",
                          allow_irreversible=True)
    assert drv.drive(launched.run_id).status is RunStatus.WAITING
    [again] = ops.approvals(run_id=launched.run_id)
    assert again.artifact == {"summary": "pay 1,000,000"}
    assert again.artifact_hash != asked.artifact_hash


def test_replay__live_from_an_approval_wait_still_asks_about_the_same_artifact(
        drv: Driver, ops: Ledger) -> None:  # noqa: F811
    """Control: a replay (no patch) from the waiting checkpoint is allowed: the state is
    the one the artifact was built from, and the new approval is for the same artifact."""
    parent = waiting_for_approval(drv, ops)
    [asked] = ops.approvals(run_id=parent)
    launched = ops.replay(parent, asked.seq, "live", "ask again")
    assert launched.status is RunStatus.WAITING
    [again] = ops.approvals(run_id=launched.run_id)
    assert (again.artifact, again.artifact_hash) == (asked.artifact, asked.artifact_hash)


def test_cli_branch__patch_at_an_approval_wait_refused_before_asking(
        drv: Driver, ops: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Invariant: the CLI refuses such a branch when it previews the diff, before asking for
    confirmation: exit 2, one audited refusal, no new run."""
    from typer.testing import CliRunner

    from console.cli import app

    parent = waiting_for_approval(drv, ops)
    [asked] = ops.approvals(run_id=parent)
    monkeypatch.setenv("ONWARD_ACTOR", "olga")
    monkeypatch.setenv("ONWARD_AUTH", "off")  # the local admin, no token
    runs_before = new_runs(ops)
    result = CliRunner().invoke(app, ["runs", "branch", str(parent), "--from", str(asked.seq),
                                      "--set", "/summary=\"pay more\"", "--reason", "r", "-y"],
                                env={"COLUMNS": "220"})
    assert result.exit_code == 2, result.output
    assert "waits for approval" in result.output
    assert new_runs(ops) == runs_before
    assert audit_actions(ops, parent) == [("branch", "refused")]


def finished_note(drv: Driver, ops: Ledger) -> UUID:  # noqa: F811
    run_id = ops.start_run("test_ops_notes", {"topic": "pricing"})
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    return run_id


EDIT_STATE = ("UPDATE onward.checkpoints SET state = jsonb_set(state, '{channel}', "
              "'\"attacker\"'), state_delta = state_delta || '[{\"op\": \"replace\", "
              "\"path\": \"/channel\", \"value\": \"attacker\"}]' "
              "WHERE run_id = :run AND seq = :seq")

SOURCES = {
    # name: (seq edited, seq copied, launch)
    "replay_of_edited_checkpoint": (2, 2, "replay"),
    "replay_past_an_edited_ancestor": (1, 2, "replay"),
    "branch_of_edited_checkpoint": (2, 2, "branch"),
}


@pytest.mark.parametrize("case", sorted(SOURCES))
def test_fork__tampered_source_is_refused_and_audited(
        drv: Driver, ops: Ledger, logs: dict[str, Path], case: str) -> None:  # noqa: F811
    """Invariant: a replay or branch verifies the checkpoint it copies (its MAC and the
    chain back to the run's start) before copying it: an edit made in SQL is refused with
    an IntegrityViolation naming the checkpoint, one audited refusal, no new run, nothing
    called. (Before, the copy got a fresh MAC: its history verified clean and it ran from
    the edited state.)"""
    edited, copied, launch = SOURCES[case]
    parent = finished_note(drv, ops)
    assert reads.execute(ops.engine, EDIT_STATE, run=parent, seq=edited) == 1
    runs_before, seen = new_runs(ops), outside(logs)
    patch = [{"op": "replace", "path": "/topic", "value": "refunds"}]

    with pytest.raises(IntegrityViolation, match=rf"checkpoint {copied} of run {parent} does "
                                                 rf"not verify.*seq {edited}: mac"):
        if launch == "replay":
            ops.replay(parent, copied, "live", "look again", allow_irreversible=True)
        else:
            ops.branch(parent, copied, patch, "new topic", allow_irreversible=True)

    assert new_runs(ops) == runs_before
    assert outside(logs) == seen
    [refused] = ops.audit(run_id=parent)
    assert (refused.action, refused.outcome) == (launch, "refused")
    assert refused.details["type"] == "IntegrityViolation"
    if launch == "branch":
        with pytest.raises(IntegrityViolation, match="does not verify"):
            ops.preview_branch(parent, copied, patch)


def test_replay__approval_artifact_edited_in_sql_is_not_asked_again(
        drv: Driver, ops: Ledger) -> None:  # noqa: F811
    """Invariant: a live replay from an approval wait asks the new approver about the
    parent's artifact only if it still hashes to what the MAC'd checkpoint asked about; an
    artifact edited in the approvals table is refused (audited), no approval is created."""
    parent = waiting_for_approval(drv, ops)
    [asked] = ops.approvals(run_id=parent)
    assert reads.execute(ops.engine, "UPDATE onward.approvals SET artifact = "
                         "'{\"summary\": \"pay 1,000,000\"}' WHERE id = :id",
                         id=asked.id) == 1
    runs_before = new_runs(ops)
    with pytest.raises(IntegrityViolation, match="edited outside onward"):
        ops.replay(parent, asked.seq, "live", "ask again")
    assert new_runs(ops) == runs_before
    assert audit_actions(ops, parent) == [("replay", "refused")]
