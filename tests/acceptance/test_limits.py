"""Fleet-wide limits, priority and Retry-After with real worker processes (docs/limits.md).

The model server (examples/model_server.py) is the outside world: a real HTTP service that
answers 429 above its own concurrency or rate and counts what it saw (requests held at
once, 429s). The workflows (tests/workflows_limits.py) call it through the official
``openai`` client, which declares ``Limit("test-model", concurrency=N)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger
from ledger.limits import LimitStore
from ledger.steps import StepStore
from ledger.vocabulary import Priority
from tests.support import reads
from tests.support.cluster import Cluster, wait_for
from tests.support.model_server import ModelServer, running_model_server
from tests.support.provider import running_provider

pytestmark = pytest.mark.acceptance

KEY = "test-model"


def _env(model: ModelServer, concurrency: int, **extra: str) -> dict[str, str]:
    return {"ONWARD_WORKFLOWS": "tests.workflows_limits", "ONWARD_MODEL_URL": model.url,
            "ONWARD_TEST_MODEL_CONCURRENCY": str(concurrency), **extra}


@pytest.fixture()
def model(tmp_path: Path) -> Iterator[ModelServer]:
    with running_model_server(tmp_path / "model", "--latency-ms", "300",
                              "--max-concurrency", "2") as server:
        yield server


def _completed(ledger: Ledger, run_id: UUID, timeout: float = 120) -> dict[str, Any]:
    return reads.wait_run(ledger.engine, run_id, timeout=timeout, what="the run to complete",
                          status="completed")


def _holding(ledger: Ledger) -> tuple[LimitStore, StepStore, UUID]:
    """A slot of the limit taken through the ledger, standing for another worker's call."""
    store = StepStore(ledger.url, ledger.keys, lease_ttl_s=30)
    limits = LimitStore(store.conn)
    holder = ledger.start_run("test_plain", {"topic": "held elsewhere"})
    granted = limits.acquire(KEY, KEY, concurrency=1, rate=None, run_id=holder, seq=0,
                             command_id="elsewhere#1", epoch=0, rank=Priority.NORMAL.rank,
                             hold_s=300.0, wait_s=5.0)
    assert granted.granted
    return limits, store, holder


def _waiting_on_limit(ledger: Ledger, run_id: UUID) -> bool:
    return reads.run_row(ledger.engine, run_id)["waiting_on"] == f"limit:{KEY}"


def test_limits__the_fleet_never_exceeds_a_declared_limit(
        ledger: Ledger, cluster: Cluster, model: ModelServer) -> None:
    """Invariant: all workers together never have more calls in flight than the limit.
    Given a model server that answers 429 above 2 requests at once and a client declaring
    concurrency=2, two threads workers of -c 4 each (8 steps at once) run 12 runs: expect
    all completed, 0 429s, at most 2 requests held at once, and the limit to have made
    steps wait (it was what bound)."""
    env = _env(model, concurrency=2)
    cluster.dispatcher(env=env)
    cluster.reaper(env=env)
    for name in ("a", "b"):
        cluster.worker(concurrency=4, pool="threads", env=env, name=f"worker-{name}")
    runs = [ledger.start_run("test_limited", {"topic": f"t{i}"}) for i in range(12)]

    for run_id in runs:
        _completed(ledger, run_id)

    stats = model.stats()
    assert stats["rejected_429"] == 0
    assert stats["max_inflight"] <= 2
    assert stats["completed"] == 12
    [state] = ledger.limits()
    assert state.granted == 12 and state.in_use == 0
    assert state.throttled > 0  # the limit, not luck, kept the server under its quota


def test_limits__a_throttled_step_holds_no_worker(
        ledger: Ledger, cluster: Cluster, model: ModelServer) -> None:
    """A step that cannot get a slot gives its worker back: with the only slot held
    elsewhere, run L waits (``limit:test-model``) while a ``-c 1`` worker runs three other
    runs to completion; once the slot is given back, L is woken and completes."""
    limits, store, holder = _holding(ledger)
    env = _env(model, concurrency=1)
    cluster.dispatcher(env=env)
    cluster.reaper(env=env)
    cluster.worker(concurrency=1, env=env)
    try:
        waiting = ledger.start_run("test_limited", {"topic": "throttled"})
        wait_for(lambda: _waiting_on_limit(ledger, waiting), timeout=60,
                 what="the limited run to wait for a slot")
        others = [ledger.start_run("test_plain", {"topic": f"p{i}"}) for i in range(3)]
        for run_id in others:
            _completed(ledger, run_id)
        assert _waiting_on_limit(ledger, waiting)
        assert model.stats()["requests"] == 0

        limits.release(KEY, run_id=holder, command_id="elsewhere#1", epoch=0)
        _completed(ledger, waiting)
    finally:
        store.close()
    assert model.stats()["requests"] == 1


def test_limits__a_worker_killed_holding_a_slot_frees_it(
        ledger: Ledger, cluster: Cluster, tmp_path: Path) -> None:
    """Invariant: a slot held by a worker that dies is freed when the time its lease
    covered the call runs out. Worker A takes the only slot for run 1's 3 s model call and
    is SIGKILLed during it; run 2 waits, then gets the slot once it expired (the call's
    20 s limit and a 1 s margin: long enough that a busy machine cannot let it lapse while
    the call is still held); both runs complete on worker B, the server never held more
    than one request and answered no 429."""
    with running_model_server(tmp_path / "model", "--latency-ms", "3000", "--jitter", "0",
                              "--max-concurrency", "1") as model:
        env = _env(model, concurrency=1, ONWARD_TOOL_LEASE_MARGIN_S="1",
                   ONWARD_TEST_MODEL_TIMEOUT_S="20")
        cluster.dispatcher(env=env)
        cluster.reaper(env=env)
        first = cluster.worker(concurrency=2, pool="threads", env=env, name="worker-a")
        run_1 = ledger.start_run("test_limited", {"topic": "dies holding"})
        wait_for(lambda: model.stats()["inflight"] == 1, timeout=60,
                 what="run 1's model call to be in flight")
        [state] = ledger.limits()
        assert state.in_use == 1
        first.kill_tree()
        run_2 = ledger.start_run("test_limited", {"topic": "waits for the dead slot"})
        cluster.worker(concurrency=2, pool="threads", env=env, name="worker-b")

        _completed(ledger, run_1)
        _completed(ledger, run_2)
        stats = model.stats()
    assert stats["rejected_429"] == 0 and stats["max_inflight"] == 1
    with ledger.engine.connect() as conn:
        waited = conn.execute(sa.text(
            "SELECT count(*) FROM onward.step_attempts WHERE outcome = 'waiting' "
            "AND run_id = ANY(:ids)"), {"ids": [run_1, run_2]}).scalar_one()
    assert waited >= 1  # someone met the dead holder's slot and waited for it


def test_limits__high_priority_runs_go_first(
        ledger: Ledger, cluster: Cluster, model: ModelServer) -> None:
    """Waiters of a limit are served higher priority first, then in order; and a high
    priority run's message is taken from the broker before normal ones. With the slot
    held elsewhere, normal runs N1..N3 and then high run H wait; once the slot is given
    back they complete H, N1, N2, N3. Then, with no worker running, normal plain runs and a
    high one are queued: a ``-c 1`` worker started afterwards takes the high one first."""
    limits, store, holder = _holding(ledger)
    env = _env(model, concurrency=1)
    cluster.dispatcher(env=env)
    cluster.reaper(env=env)
    worker = cluster.worker(concurrency=1, env=env)
    try:
        normal = []
        for i in range(3):
            normal.append(ledger.start_run("test_limited", {"topic": f"n{i}"}))
            wait_for(lambda: _waiting_on_limit(ledger, normal[-1]), timeout=60,
                     what=f"run n{i} to wait for a slot")
        high = ledger.start_run("test_limited", {"topic": "h"}, priority="high")
        wait_for(lambda: _waiting_on_limit(ledger, high), timeout=60,
                 what="the high run to wait for a slot")
        limits.release(KEY, run_id=holder, command_id="elsewhere#1", epoch=0)
        finished = {run_id: _completed(ledger, run_id)["finished_at"]
                    for run_id in [high, *normal]}
    finally:
        store.close()
    assert sorted(finished, key=lambda r: finished[r]) == [high, *normal]

    worker.stop()
    queued = [ledger.start_run("test_plain", {"topic": f"q{i}"}) for i in range(3)]
    first = ledger.start_run("test_plain", {"topic": "urgent"}, priority=Priority.HIGH)
    with ledger.engine.connect() as conn:
        def published() -> bool:
            return conn.execute(sa.text(
                "SELECT count(*) FROM onward.outbox WHERE published_at IS NULL")).scalar_one() == 0
        wait_for(published, timeout=60, what="the dispatcher to queue all four messages")
    cluster.worker(concurrency=1, env=env, name="worker-after")
    started = {run_id: _completed(ledger, run_id)["finished_at"]
               for run_id in [first, *queued]}
    assert min(started, key=lambda r: started[r]) == first


def test_limits__a_429_with_retry_after_defers_the_step_without_a_worker(
        ledger: Ledger, cluster: Cluster, tmp_path: Path) -> None:
    """A model server limited to 1 request per second answers the second of two calls made
    at once 429 with Retry-After: 1. The client's retry policy defers that step (no attempt
    spent, no worker held) and calls again no sooner than 1 s later; both runs complete,
    each with one step attempt counted."""
    with running_model_server(tmp_path / "model", "--latency-ms", "50", "--rate", "1") as model:
        env = _env(model, concurrency=100)
        cluster.dispatcher(env=env)
        cluster.reaper(env=env)
        cluster.worker(concurrency=2, pool="threads", env=env)
        runs = [ledger.start_run("test_limited", {"topic": f"r{i}"}) for i in range(2)]
        rows = [_completed(ledger, run_id) for run_id in runs]
        stats = model.stats()
    assert stats["rejected_429"] >= 1 and stats["completed"] == 2
    assert [row["attempts_total"] for row in rows] == [1, 1]
    with ledger.engine.connect() as conn:
        gaps = conn.execute(sa.text(
            "SELECT extract(epoch FROM n.started_at - w.ended_at) AS gap "
            "FROM onward.step_attempts w JOIN onward.step_attempts n "
            "ON n.run_id = w.run_id AND n.lease_epoch = w.lease_epoch + 1 "
            "WHERE w.outcome = 'waiting' AND w.error_message LIKE '%rate_limited%' "
            "AND w.run_id = ANY(:ids)"), {"ids": runs}).scalars().all()
    assert gaps and min(gaps) >= 0.95  # Retry-After: 1, by the database's clock


def test_limits__a_worker_killed_holding_an_effects_slot_and_a_deferred_step_sends_once(
        ledger: Ledger, cluster: Cluster, tmp_path: Path) -> None:
    """Invariant (never repeat, never lost): an irreversible effect under a fleet limit
    of one. Worker A's call for run 1 holds the slot at the reference provider, which
    created the offer and holds its answer; run 2 finds the limit full and is deferred
    (no lease). Worker A is then SIGKILLed, and the provider's next create answers 429
    Retry-After: 1. On worker B run 1 finds its offer by key (no slot, nothing sent);
    run 2 gets the slot once the dead holder's cover ran out, is refused (429, deferred
    again) and sent once more. Both complete: two offers, three create requests, no
    duplicate, no slot left in use."""
    with running_provider(tmp_path / "provider") as provider:
        provider.arm("limited_offers", hold=1, hold_s=60.0)
        env = {"ONWARD_WORKFLOWS": "tests.workflows_limits",
               "ONWARD_EXAMPLE_PROVIDER_URL": provider.url, "ONWARD_TOOL_LEASE_MARGIN_S": "1"}
        cluster.dispatcher(env=env)
        cluster.reaper(env=env)
        first = cluster.worker(concurrency=2, pool="threads", env=env, name="worker-a")
        run_1 = ledger.start_run("test_limited_offer", {"topic": "dies holding the slot"})
        wait_for(lambda: provider.stats().get("created", 0) == 1, timeout=60,
                 what="run 1's offer to be created and its answer held")
        run_2 = ledger.start_run("test_limited_offer", {"topic": "deferred"})
        wait_for(lambda: reads.run_row(ledger.engine, run_2)["waiting_on"]
                 == "limit:test-provider", timeout=60, what="run 2 to wait for the slot")
        provider.arm("limited_offers", error_429=1)
        first.kill_tree()
        cluster.worker(concurrency=2, pool="threads", env=env, name="worker-b")

        rows = {run_id: _completed(ledger, run_id) for run_id in (run_1, run_2)}
        stats = provider.stats()
    assert stats["by_collection"] == {"limited_offers": 2}, stats
    assert (stats["requests"], stats["rejected_429"], stats["duplicate_objects"]) == (3, 1, 0)
    [held] = ledger.effects(run_1)
    assert [(a.kind, a.outcome) for a in ledger.effect_attempts(held)] == [
        ("call", None), ("lookup", "found")]
    [refused] = ledger.effects(run_2)
    assert [(a.kind, a.outcome) for a in ledger.effect_attempts(refused)] == [
        ("call", "failed"), ("call", "completed")]
    assert rows[run_1]["result"]["answer"] == held.provider_ref
    assert rows[run_2]["result"]["answer"] == refused.provider_ref
    assert [state.in_use for state in ledger.limits()] == [0]
