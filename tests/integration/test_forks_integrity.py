"""Replays and branches copy only what verifies, and never let a person approve one thing
while the run acts on another (DESIGN.md sections 6 and 8, invariants 5 and 6). Steps run
in the test process (tests/support/driver.py) against a real PostgreSQL; the outside world
is counted by the local tool's and the fake model's call logs."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus
from ledger.exceptions import OperationRefused
from tests.integration.test_operations import (  # noqa: F401 - fixtures
    audit_actions,
    drv,
    ledger_ops,
    logs,
    ops,
    outside,
)
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
    monkeypatch.setenv("ONWARD_ROLE", "operator")
    runs_before = new_runs(ops)
    result = CliRunner().invoke(app, ["runs", "branch", str(parent), "--from", str(asked.seq),
                                      "--set", "/summary=\"pay more\"", "--reason", "r", "-y"],
                                env={"COLUMNS": "220"})
    assert result.exit_code == 2, result.output
    assert "waits for approval" in result.output
    assert new_runs(ops) == runs_before
    assert audit_actions(ops, parent) == [("branch", "refused")]
