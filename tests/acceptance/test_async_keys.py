"""Concurrent ``ctx`` calls of one async step whose order differs on a retry, with real
`onward worker` processes, the reference provider and the loopback model server
(docs/steps.md, "Async steps"; docs/effects.md, "The protocol"). Two gathered branches each
wait on something outside ``ctx`` first, the longer for branch a on the first attempt and
for branch b on a retry; the first attempt's worker is SIGKILLed right after the
provider's answer to the step's first effect call, before it is recorded. What the
provider and the model server saw is counted there."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from ledger import Ledger
from ledger.vocabulary import Role
from tests.support import reads
from tests.support.cluster import Cluster, Proc, wait_for
from tests.support.model_server import ModelServer, model_fixture
from tests.support.provider import Provider, provider_fixture

pytestmark = pytest.mark.acceptance

WORKFLOWS = "tests.workflows_async"
KILL = "after_provider_response@fan_out:kill:once"
CALLS = pytest.mark.parametrize("calls", ["effects", "mixed", "models"])


provider = provider_fixture()
model = model_fixture("--latency-ms", "50")


def _env(provider: Provider, model: ModelServer, tmp_path: Path) -> dict[str, str]:
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    return {"ONWARD_WORKFLOWS": WORKFLOWS, "ONWARD_EXAMPLE_PROVIDER_URL": provider.url,
            "ONWARD_TEST_MARKS": str(marks), "ONWARD_MODEL_URL": model.url}


def _run_killed_once(ledger: Ledger, cluster: Cluster, env: dict[str, str],
                     state: dict[str, Any]) -> tuple[UUID, dict[str, Any]]:
    """Start the run on a threads worker armed to die after the first provider answer; once
    it died (or the run ended without it dying), a second worker carries on. The run's row
    once it has stopped moving: completed, failed or parked."""
    cluster.dispatcher(env=env)
    cluster.reaper(env=env)
    first: Proc = cluster.worker(concurrency=4, pool="threads", env={**env, "ONWARD_FAULTS": KILL},
                                 name="worker-a")
    run_id = ledger.start_run("test_async_pair", state)

    def ended() -> bool:
        return reads.run_row(ledger.engine, run_id)["status"] in {
            "completed", "failed", "needs_review"}

    wait_for(lambda: not first.alive() or ended(), timeout=60,
             what="the worker to die at the fault, or the run to end", seen=first.tail)
    if not first.alive():
        cluster.worker(concurrency=4, pool="threads", env=env, name="worker-b")
    row = reads.wait_run(ledger.engine, run_id, timeout=90, what="the run to end",
                         until=lambda r: r["status"] in {"completed", "failed", "needs_review"})
    return run_id, row



@CALLS
def test_async_step__keyless_calls_of_helper_tasks_are_refused_before_any_is_made(
        ledger: Ledger, cluster: Cluster, provider: Provider, model: ModelServer,
        tmp_path: Path, calls: str) -> None:
    """Invariant (resume, never repeat): calls without a key, made in helper tasks whose
    order can change on a retry, are refused on the first attempt, before anything is
    called: the run fails with OutcomeError saying to pass key=, the provider and the model
    saw nothing. (Before the refusal, the retry took the other branch's position: with two
    effects the run was parked effect_conflict and with two model calls evidence_conflict,
    both saying nothing of the cause; with a model call and an effect the effect was sent
    again under a new key, two objects for one effect, the first left pending forever.)"""
    run_id, row = _run_killed_once(ledger, cluster, _env(provider, model, tmp_path),
                                   {"calls": calls})
    stats = provider.stats()
    assert (row["status"], row["parked_reason"], stats["by_collection"]) == (
        "failed", None, {}), (row["last_error"], stats)
    assert row["last_error"]["type"] == "OutcomeError"
    assert "without key= in a task the async step started" in row["last_error"]["message"]
    assert "Pass key=" in row["last_error"]["message"]
    assert stats.get("requests", 0) == 0 and model.stats()["completed"] == 0
    assert [(a["attempt"], a["outcome"], a["error_type"])
            for a in reads.attempts(ledger.engine, run_id)] == [(1, "failed", "OutcomeError")]
    assert ledger.acting_as("olga", Role.OPERATOR).effects(run_id) == []


@CALLS
def test_async_step__keyed_calls_of_helper_tasks_resume_in_another_order_without_repeating(
        ledger: Ledger, cluster: Cluster, provider: Provider, model: ModelServer,
        tmp_path: Path, calls: str) -> None:
    """Invariant (resume, never repeat): the same branches with a key each. The first
    attempt dies right after the provider accepted the first effect, the retry reaches the
    calls in the opposite order: every effect is created once (the lost one found by
    lookup under its key), every model answer asked for once and given back to the call
    that asked it, the run completed."""
    run_id, row = _run_killed_once(ledger, cluster, _env(provider, model, tmp_path),
                                   {"calls": calls, "keyed": True})
    assert row["status"] == "completed", row["last_error"]
    assert row["restore_count"] >= 1
    ops = ledger.acting_as("olga", Role.OPERATOR)
    effects = {e.command_id.split(":")[-1]: e for e in ops.effects(run_id)}
    attempts = {key: [a.kind for a in ops.effect_attempts(e)] for key, e in effects.items()}
    result = ops.get_run(run_id).result
    stats = provider.stats()
    if calls == "effects":  # b's create was accepted when the first worker died
        assert attempts == {"a": ["call"], "b": ["call", "lookup"]}
        assert stats["by_collection"] == {"async_offers": 2}
        assert (result["a"], result["b"]) == (effects["a"].provider_ref,
                                              effects["b"].provider_ref)
    elif calls == "mixed":
        assert attempts == {"b": ["call", "lookup"]}
        assert stats["by_collection"] == {"async_offers": 1}
        assert result["b"] == effects["b"].provider_ref and "customer a" in result["a"]
    else:
        assert attempts == {"final": ["call", "lookup"]}
        assert stats["by_collection"] == {"async_offers": 1}
        assert "customer a" in result["a"] and "customer b" in result["b"]
    assert stats["duplicate_objects"] == 0
    assert model.stats()["completed"] == {"effects": 0, "mixed": 1, "models": 2}[calls]
    assert ops.verify_run(run_id) == []
