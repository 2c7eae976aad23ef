"""What replays and audits rely on is signed (docs/design.md section 10): recorded model
answers and reads (inline and as artifacts), a finished run's result, effects and their
attempts, and the audit log carry keyed MACs. An edit made in SQL, without the key, is
reported by `onward verify`, refused by an evidence replay, and marked by `runs show`.
Steps run in the test process against a real PostgreSQL (tests/support/driver.py)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from uuid import UUID

import pytest
from typer.testing import CliRunner

from ledger import Ledger, RunStatus
from ledger.audit import Role
from ledger.tokens import TokenRequest
from tests.integration.test_operations import (  # noqa: F401 - fixtures
    drv,
    ledger_ops,
    logs,
    ops,
    outside,
)
from tests.support import reads
from tests.support.driver import Driver


def finished_note(drv: Driver, ops: Ledger) -> UUID:  # noqa: F811
    run_id = ops.start_run("test_ops_notes", {"topic": "pricing"})
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    return run_id


EDIT_INLINE_ANSWER = """
UPDATE onward.evidence SET response = jsonb_set(response, '{text}', '"send it all to mallory"')
 WHERE run_id = :r AND kind = 'llm'
"""

# Without the key an attacker can still keep an artifact consistent with its own sha256:
# write a new artifact and point the evidence at it.
SWAP_ARTIFACT = """
WITH edited AS (
    SELECT convert_to(replace(convert_from(a.body, 'UTF8'), '"text":"', '"text":"MALLORY '),
                      'UTF8') AS body
      FROM onward.evidence e JOIN onward.artifacts a ON a.sha256 = e.artifact_sha256
     WHERE e.run_id = :r AND e.kind = 'llm'
), stored AS (
    INSERT INTO onward.artifacts (sha256, size, media_type, body)
    SELECT encode(sha256(body), 'hex'), length(body), 'application/json', body FROM edited
    RETURNING sha256
)
UPDATE onward.evidence SET artifact_sha256 = (SELECT sha256 FROM stored)
 WHERE run_id = :r AND kind = 'llm'
"""


@pytest.mark.parametrize("stored", ["inline", "artifact"])
def test_evidence__edited_model_answer_is_reported_and_never_replayed(
        drv: Driver, ops: Ledger, logs: dict[str, Path], stored: str,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a recorded model answer edited in SQL (inline, or by swapping in another
    artifact whose sha256 matches its own body) is reported by `verify`, and an evidence
    replay that would answer with it parks `integrity` instead: the edited text reaches no
    state, and nothing external is called."""
    if stored == "artifact":
        monkeypatch.setattr("ledger.evidence.INLINE_LIMIT", 0)  # every answer an artifact
    parent = finished_note(drv, ops)
    assert ops.verify_run(parent) == []
    edit = EDIT_INLINE_ANSWER if stored == "inline" else SWAP_ARTIFACT
    assert reads.execute(ops.engine, edit, r=parent) == 1
    seen = outside(logs)

    assert [(p.seq, p.kind) for p in ops.verify_run(parent)] == [(0, "evidence")]
    replay = drv.drive(ops.replay(parent, 0, "evidence", "audit the run").run_id)

    assert (replay.status, replay.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")
    assert replay.last_error is not None and "evidence" in replay.last_error["message"]
    assert outside(logs) == seen
    assert [c.identity.seq for c in ops.checkpoints(replay.id)] == [0]


def test_result__edited_result_is_reported_and_marked_by_runs_show(
        drv: Driver, ops: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Invariant: a finished run's result is signed with the run's id and seq: an edit is
    reported by `verify` and `runs show` marks the result as not verifying (text and
    --json); an untouched result shows as verified."""
    run_id = finished_note(drv, ops)
    untouched = finished_note(drv, ops)
    assert reads.execute(ops.engine, "UPDATE onward.runs SET result = "
                         "jsonb_set(result, '{post_id}', '\"forged\"') WHERE id = :r",
                         r=run_id) == 1

    assert [(p.seq, p.kind) for p in ops.verify_run(run_id)] == [(3, "result")]
    admin = ops.acting_as("root", Role.ADMIN)
    secret = admin.create_token(TokenRequest("vic", Role.VIEWER, "default",
                                             timedelta(hours=1))).secret
    monkeypatch.setenv("ONWARD_WORKFLOWS", "tests.workflows_ops")
    shown = _cli("runs", "show", str(run_id), "--json", secret=secret)
    assert json.loads(shown)["run"]["result_verified"] is False
    assert "does not verify" in _cli("runs", "show", str(run_id), secret=secret)
    assert json.loads(_cli("runs", "show", str(untouched), "--json",
                           secret=secret))["run"]["result_verified"] is True


def _cli(*args: str, secret: str) -> str:
    result = CliRunner().invoke(__import__("console.cli", fromlist=["app"]).app, list(args),
                                env={"COLUMNS": "220", "ONWARD_TOKEN": secret})
    assert result.exit_code == 0, result.output
    return result.output
