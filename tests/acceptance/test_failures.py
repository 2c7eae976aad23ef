"""Step errors: retried with backoff through the outbox, failed when the budget is spent or
the error is non-retryable, and a step returning nonsense fails its run (never a stuck run).

One dispatcher and one worker serve the module; no reaper, so every end state here is
reached by the executor itself, not by recovery. The worker's retry backoff is raised to
0.5 s base (cap 2 s) so the delay is measurable against a busy machine's noise.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any
from uuid import UUID

import pytest

from ledger import Ledger
from tests.support import reads
from tests.support.cluster import Cluster, Proc

pytestmark = pytest.mark.acceptance

RETRY_BASE_S = 0.5


@pytest.fixture()
def settings_env(module_env: dict[str, str]) -> dict[str, str]:
    return module_env


@pytest.fixture(scope="module")
def processes(module_cluster: Cluster) -> list[Proc]:
    return [module_cluster.dispatcher(),
            module_cluster.worker(concurrency=2, env={"ONWARD_RETRY_BASE_S": str(RETRY_BASE_S),
                                                      "ONWARD_RETRY_MAX_S": "2"})]


def _ended(ledger: Ledger, run_id: UUID, status: str) -> dict[str, Any]:
    return reads.wait_run(ledger.engine, run_id, timeout=60, what=f"run to be {status}",
                          status=status)


def test_retry__flaky_step_retries_with_backoff_then_succeeds(
        ledger: Ledger, shared_cluster: Cluster, processes: list[Proc]) -> None:
    """A step that raises on its first two attempts is retried through a delayed outbox row
    (published by the dispatcher once due) and succeeds on attempt 3: attempts read
    failed, failed, committed; each retry started no sooner than the backoff's lower bound
    (base * 2^(n-1) / 2); one checkpoint per seq; errors recorded on the attempts."""
    run_id = ledger.start_run("test_flaky", {"fail_times": 2})
    row = _ended(ledger, run_id, "completed")

    assert row["result"] == {"attempt": 3}
    assert (row["attempts_total"], row["last_error"]) == (3, None)
    tried = reads.attempts(ledger.engine, run_id)
    assert [(a["attempt"], a["outcome"]) for a in tried] == [
        (1, "failed"), (2, "failed"), (3, "committed")]
    assert [a["error_message"] for a in tried] == [
        "failure on attempt 1", "failure on attempt 2", None]
    assert {a["error_type"] for a in tried[:2]} == {"StepError"}
    for n, (failed, retried) in enumerate(pairwise(tried), start=1):
        waited = (retried["started_at"] - failed["ended_at"]).total_seconds()
        assert waited >= RETRY_BASE_S * 2 ** (n - 1) / 2, (n, waited)
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1]
    assert reads.outbox_rows(ledger.engine, run_id) == []


def test_retry__spent_budget_fails_the_run_with_the_error_visible(
        ledger: Ledger, shared_cluster: Cluster, processes: list[Proc]) -> None:
    """A step that always raises is tried exactly max_attempts (3) times, then the run is
    failed with the last error (type, message, step, attempt numbers) on the run; nothing
    is left in the outbox to try again."""
    run_id = ledger.start_run("test_flaky", {"fail_times": 100})
    row = _ended(ledger, run_id, "failed")

    assert row["attempts_total"] == 3 == row["max_attempts"]
    assert row["last_error"] == {"type": "StepError", "message": "failure on attempt 3",
                                 "step": "wobble", "attempt": 3, "max_attempts": 3}
    assert row["finished_at"] is not None and row["lease_owner"] is None
    assert [a["outcome"] for a in reads.attempts(ledger.engine, run_id)] == ["failed"] * 3
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0]
    assert reads.outbox_rows(ledger.engine, run_id) == []


def test_retry__non_retryable_error_fails_at_once(
        ledger: Ledger, shared_cluster: Cluster, processes: list[Proc]) -> None:
    """StepError(non_retryable=True) fails the run on its first attempt, budget unspent."""
    run_id = ledger.start_run("test_flaky", {"fail_times": 1, "non_retryable": True})
    row = _ended(ledger, run_id, "failed")

    assert row["attempts_total"] == 1
    assert row["last_error"]["message"] == "failure on attempt 1"
    assert [a["outcome"] for a in reads.attempts(ledger.engine, run_id)] == ["failed"]
    assert reads.outbox_rows(ledger.engine, run_id) == []


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("unknown_step", "went to unknown step 'no_such_step'"),
        ("bad_state", "state update is invalid for Bad"),
        ("unknown_field", "names fields ['nonexistent'] that Bad does not have"),
        ("not_json", "finish result cannot be stored: value is not plain JSON"),
        ("not_an_outcome", "returned str; return ctx.goto(...), ctx.finish(...) or ctx.fail"),
    ],
)
def test_outcome__bad_outcome_fails_the_run_with_a_clear_error(
        ledger: Ledger, shared_cluster: Cluster, processes: list[Proc], mode: str,
        message: str) -> None:
    """A step whose outcome cannot be committed (unknown next step, invalid state update,
    unknown field, non-JSON result, not an outcome at all) fails its run on the first
    attempt with an OutcomeError saying what is wrong: the code is wrong, retrying cannot
    help, and the run never stays stuck as 'running'."""
    run_id = ledger.start_run("test_broken", {"mode": mode})
    row = _ended(ledger, run_id, "failed")

    assert row["last_error"]["type"] == "OutcomeError"
    assert message in row["last_error"]["message"]
    assert row["attempts_total"] == 1
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0]
    assert [a["outcome"] for a in reads.attempts(ledger.engine, run_id)] == ["failed"]
