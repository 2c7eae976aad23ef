"""Budgets survive a worker killed mid-step: real workers, dispatcher and reaper; the step
SIGKILLs its own worker process after paying for model calls, and the calls the outside
world billed are counted from the model's own log (one line per paid call)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import Ledger, RunStatus
from ledger.runs import Budgets
from tests.support.cluster import Cluster, wait_for
from tests.workflows_budgets import COST_PER_CALL, TOKENS_PER_CALL

pytestmark = pytest.mark.acceptance


@pytest.mark.parametrize("kind", ["tokens", "cost_usd"])
def test_budget__a_worker_killed_mid_step_gives_the_next_attempt_no_fresh_allowance(
        ledger: Ledger, cluster: Cluster, tmp_path: Path, kind: str) -> None:
    """Invariant: a budget is never exceeded by more than one call's spend, crashes
    included. Budget 100 tokens (or $1.00); each call bills 60 tokens and $0.60. Without a
    crash the step makes 2 calls and stops (120 spent). Here the worker is SIGKILLed right
    after its 2nd paid call, mid-step: the next attempt must not get a fresh allowance
    (before, each attempt paid for 2 more calls: 6 calls, 360 tokens, over 3 attempts)."""
    paid = tmp_path / "paid.log"
    env = {"ONWARD_WORKFLOWS": "tests.workflows_budgets", "ONWARD_FAKE_LLM_LOG": str(paid)}
    cluster.dispatcher(env=env)
    cluster.reaper(env=env)
    worker = cluster.worker(concurrency=1, env=env)
    budgets = Budgets(tokens=100) if kind == "tokens" else Budgets(cost_usd=1.0)
    run_id = ledger.start_run("test_spender", {"kill_after": 2}, budgets=budgets)
    run = wait_for(lambda: (r := ledger.get_run(run_id)) and r.status is not RunStatus.RUNNING
                   and r, timeout=90, what="the run to stop",
                   seen=lambda: ledger.get_run(run_id))
    assert worker.alive(), "the worker's main process must survive its child's SIGKILL"
    billed = paid.read_text().splitlines()
    assert len(billed) == 2
    assert run.used_tokens == 2 * TOKENS_PER_CALL
    assert float(run.used_cost_usd) == pytest.approx(2 * COST_PER_CALL)
    assert run.status is RunStatus.FAILED and run.last_error["reason"] == "budget_exhausted"
    lost = [e for e in ledger.timeline(run_id) if e.outcome == "worker_lost"]
    assert len(lost) == 1, "the step was to be killed mid-step once, then refused to start"
