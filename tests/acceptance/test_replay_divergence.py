"""An evidence replay on workers running changed code: the divergence is reported where it
happens, and nothing is called. Own module: it needs workers of two code versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import Ledger, RunStatus
from tests.acceptance.test_operations import model_calls
from tests.support.cluster import Cluster, stopped

pytestmark = pytest.mark.acceptance

WORKFLOWS = "tests.workflows_ops"


def test_replay_evidence__changed_code_reports_divergence(
        ledger: Ledger, cluster: Cluster, tmp_path: Path) -> None:
    """Invariant: after a deploy that changes what a step asks the model, an evidence replay
    stops as diverged at that call (step, seq, command id, why) and calls nothing."""
    model_log = tmp_path / "llm-calls.log"
    env = {"ONWARD_WORKFLOWS": WORKFLOWS, "ONWARD_FAKE_LLM_LOG": str(model_log),
           "ONWARD_TEST_OPS_CALLS": str(tmp_path / "tool.log")}
    ops = ledger.acting_as("olga", "operator")
    cluster.dispatcher(env=env)
    old_code = cluster.worker(concurrency=1, env=env, name="old-code")
    parent = ops.start_run("test_ops_notes", {"topic": "renewals"})
    assert stopped(ops, parent) is RunStatus.COMPLETED
    old_code.stop()
    cluster.worker(concurrency=1, env={**env, "ONWARD_TEST_OPS_VARIANT": "reworded"},
                   name="new-code")
    before = (model_calls(model_log), model_calls(tmp_path / "tool.log"))
    replay = ops.replay(parent, 0, "evidence", "does the new prompt behave the same?").run_id
    assert stopped(ops, replay) is RunStatus.DIVERGED
    report = ops.get_run(replay).last_error
    assert report["where"] == {"step": "summarize", "seq": 0, "command_id": "summarize@0#1"}
    assert (report["kind"], report["why"]) == ("llm", "request_differs")
    assert "summarize" in report["message"]
    assert (model_calls(model_log), model_calls(tmp_path / "tool.log")) == before
    assert [e.outcome for e in ops.timeline(replay)] == ["failed"]
