"""Async steps and step timeouts with real `onward worker` processes on the prefork and
threads pools, the reference provider and the loopback model server (examples/), a real
dispatcher and reaper (docs/steps.md). What the outside world saw is counted there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from harness.processes import ROOT
from ledger import Ledger
from ledger.vocabulary import Role
from tests.support import reads
from tests.support.cluster import Cluster, Proc, wait_for
from tests.support.messages import Publisher
from tests.support.model_server import ModelServer, model_fixture
from tests.support.provider import Provider, provider_fixture

pytestmark = pytest.mark.acceptance

POOLS = pytest.mark.parametrize("pool", ["prefork", "threads"])
WORKFLOWS = "tests.workflows_async"


provider = provider_fixture()
model = model_fixture("--latency-ms", "50")


def fleet_env(provider: Provider, marks: Path, model: ModelServer | None = None,
              **extra: str) -> dict[str, str]:
    marks.mkdir(exist_ok=True)
    env = {"ONWARD_WORKFLOWS": WORKFLOWS, "ONWARD_EXAMPLE_PROVIDER_URL": provider.url,
           "ONWARD_TEST_MARKS": str(marks), **extra}
    if model is not None:
        env["ONWARD_MODEL_URL"] = model.url
    return env


def worker(cluster: Cluster, pool: str, env: dict[str, str], name: str = "worker") -> Proc:
    return cluster.worker(concurrency=1 if pool == "prefork" else 4, pool=pool, env=env,
                          name=name)


def marks(folder: Path, run_id: UUID) -> list[str]:
    path = folder / str(run_id)
    return path.read_text().splitlines() if path.exists() else []


def completed(ledger: Ledger, run_id: UUID, timeout: float = 90) -> dict[str, Any]:
    return reads.wait_run(ledger.engine, run_id, timeout=timeout, what="the run to complete",
                          status="completed")


@POOLS
@pytest.mark.parametrize("point", ["after_provider_response", "after_effect_recorded"])
def test_async_step__sigkill_mid_step_resumes_without_repeating_the_effect(
        ledger: Ledger, cluster: Cluster, provider: Provider, model: ModelServer,
        tmp_path: Path, pool: str, point: str) -> None:
    """Invariant (resume, never repeat): an async step awaits a model call (the loopback
    model server, through openai's AsyncOpenAI) and an async effect (the reference
    provider, through httpx.AsyncClient); its worker is SIGKILLed right after the provider
    answered (before the answer is recorded: the next attempt looks the key up) or right
    after it was recorded. Another worker resumes the run: one object at the provider, the
    first step's model answer not asked for again, the run completed with one committed
    attempt per seq."""
    folder = tmp_path / "marks"
    env = fleet_env(provider, folder, model)
    cluster.dispatcher(env=env)
    cluster.reaper(env=env)
    first = worker(cluster, pool, {**env, "ONWARD_FAULTS": f"{point}@draft:kill:once"},
                   name="worker-a")
    run_id = ledger.start_run("test_async", {"topic": "resumable agents"})
    wait_for(lambda: not first.alive() if pool == "threads" else
             "exited with 'signal 9 (SIGKILL)'" in first.log(),
             timeout=60, what="the worker to die at the fault", seen=first.tail)
    worker(cluster, pool, env, name="worker-b")

    row = completed(ledger, run_id)
    assert row["restore_count"] >= 1
    stats = provider.stats()
    assert stats["by_collection"] == {"async_offers": 1}, stats
    assert stats["requests"] == 1
    ops = ledger.acting_as("olga", Role.OPERATOR)
    [effect] = ops.effects(run_id)
    kinds = [a.kind for a in ops.effect_attempts(effect)]
    assert kinds == (["call", "lookup"] if point == "after_provider_response" else ["call"])
    assert model.stats()["completed"] == 3  # draft once, publish's two gathered calls once
    assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1}
    assert ops.get_run(run_id).result["offer_id"] == effect.provider_ref
    assert ops.verify_run(run_id) == []


@POOLS
def test_timeout__a_step_past_it_is_retried_and_its_effect_not_repeated(
        ledger: Ledger, cluster: Cluster, provider: Provider, tmp_path: Path,
        pool: str) -> None:
    """Invariant: a plain step with a 1 s timeout sends its effect, then hangs 3 s (well
    inside the 6 s lease the timeout and the 5 s margin give it): the attempt is recorded
    failed StepTimedOut, the retry gets the recorded effect back, one object. On prefork
    the body is interrupted (it never wakes); on threads it cannot be, and its late result
    is refused."""
    folder = tmp_path / "marks"
    env = fleet_env(provider, folder)
    cluster.dispatcher(env=env)
    worker(cluster, pool, env)
    run_id = ledger.start_run("test_timeout_effect", {"hang_s": 3.0})

    completed(ledger, run_id)
    attempts = reads.attempts(ledger.engine, run_id)
    assert [(a["outcome"], a["error_type"]) for a in attempts] == [
        ("failed", "StepTimedOut"), ("committed", None)]
    assert provider.stats()["by_collection"] == {"held_offers": 1}
    seen = [line.split(" pid=")[0] for line in marks(folder, run_id)]
    woke = ["woke attempt=1"] if pool == "threads" else []
    assert sorted(seen) == sorted(["effect_returned attempt=1", "effect_returned attempt=2",
                                   *woke])


@POOLS
def test_timeout__a_call_that_landed_is_reconciled_not_resent(
        ledger: Ledger, cluster: Cluster, provider: Provider, tmp_path: Path,
        pool: str) -> None:
    """Invariant (never a blind resend): the provider creates the object, then holds its
    answer 4 s; the step's 1 s timeout cuts the call (prefork: interrupted; threads: the
    reference client was given only the time the step had left). The attempt is recorded
    with an unknown outcome, and the retry looks the key up and finds the object instead
    of sending again: one object, one create request."""
    provider.arm("held_offers", hold=1, hold_s=4.0)
    folder = tmp_path / "marks"
    env = fleet_env(provider, folder)
    cluster.dispatcher(env=env)
    worker(cluster, pool, env)
    run_id = ledger.start_run("test_timeout_effect", {})

    completed(ledger, run_id)
    stats = provider.stats()
    assert stats["by_collection"] == {"held_offers": 1} and stats["held_responses"] == 1
    ops = ledger.acting_as("olga", Role.OPERATOR)
    [effect] = ops.effects(run_id)
    assert [(a.kind, a.outcome) for a in ops.effect_attempts(effect)] == [
        ("call", "unknown"), ("lookup", "found")]
    assert [(a["outcome"], a["error_type"]) for a in reads.attempts(ledger.engine, run_id)
            ] == [("failed", "StepTimedOut"), ("committed", None)]


@POOLS
def test_timeout__a_step_inside_it_is_not_taken_over(
        ledger: Ledger, cluster: Cluster, publisher: Publisher, provider: Provider,
        settings_env: dict[str, str], tmp_path: Path, pool: str) -> None:
    """Invariant: a step with a 30 s timeout runs longer than the default lease (3 s here)
    with no heartbeat; its claim leased it for the timeout and the margin, so neither the
    reaper nor a second worker given a duplicate of its message (after the default lease
    would have run out) takes it over: one attempt, no restore, the body ran once."""
    assert settings_env["ONWARD_LEASE_TTL_S"] == "3"
    folder = tmp_path / "marks"
    env = fleet_env(provider, folder)
    cluster.dispatcher(env=env)
    cluster.reaper(env=env)
    worker(cluster, pool, env, name="worker-a")
    worker(cluster, pool, env, name="worker-b")
    release = tmp_path / "release"
    run_id = ledger.start_run("test_timeout_long", {"release_file": str(release)})
    wait_for(lambda: marks(folder, run_id), timeout=60, what="the step to start")
    claimed = reads.attempts(ledger.engine, run_id)[0]["started_at"]

    def default_lease_over() -> bool:
        with ledger.engine.connect() as conn:
            now = conn.execute(sa.text("SELECT onward.now()")).scalar_one()
        return bool((now - claimed).total_seconds() > 4)

    wait_for(default_lease_over, timeout=30, what="the default lease to run out")
    publisher.step(run_id, 0)
    publisher.step(run_id, 0)
    wait_for(lambda: reads.run_row(ledger.engine, run_id)["stale_deliveries"] >= 2,
             timeout=30, what="both duplicates to be refused",
             seen=lambda: reads.run_row(ledger.engine, run_id))
    release.touch()

    row = completed(ledger, run_id)
    assert row["restore_count"] == 0
    assert [(a["outcome"], a["attempt"]) for a in reads.attempts(ledger.engine, run_id)] == [
        ("committed", 1)]
    assert [line.split(" pid=")[0] for line in marks(folder, run_id)] == [
        "started attempt=1", "released attempt=1"]


def test_gevent_worker__refuses_async_workflows_at_start(settings_env: dict[str, str]) -> None:
    """A gevent worker whose workflows have async steps exits at start (status 2) with a
    message naming them and the pools to use: never a failure at run time."""
    env = {**os.environ, **settings_env, "ONWARD_WORKFLOWS": WORKFLOWS}
    done = subprocess.run([sys.executable, "-m", "console", "worker", "-P", "gevent", "-c",
                           "10"], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "gevent pool cannot run async" in done.stderr
    assert "test_async v1: async step draft" in done.stderr
    assert "--pool threads" in done.stderr
