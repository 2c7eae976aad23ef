"""Eager continuation (workers/runtime.py): after a commit, the worker runs the run's next
steps itself, each claimed and committed through the ledger, within ``eager_steps`` and
``eager_window_ms``; then it publishes the next message as usual. The worker runtime is
driven in-process here against the real PostgreSQL and the real Redis, so what went through
the broker is counted in Redis itself."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from typing import Any
from uuid import UUID

import pytest

from ledger import Ledger
from tasks import faults
from tasks.workflow import Registry
from tests.support import reads
from tests.support.messages import Publisher
from workers.app import create_app
from workers.runtime import WorkerRuntime
from workers.settings import WorkerSettings

Factory = Callable[..., WorkerRuntime]


@pytest.fixture()
def runtime(settings: WorkerSettings) -> Iterator[Factory]:
    """A worker runtime with the test's settings, overridden per test (eager_steps, ...)."""
    made: list[WorkerRuntime] = []

    def make(**overrides: Any) -> WorkerRuntime:
        tuned = settings.model_copy(update=overrides)
        registry = Registry()
        registry.load_modules(["tests.workflows"])
        app = create_app(tuned, registry=registry)
        made.append(app.onward_runtime)  # type: ignore[attr-defined]
        return made[-1]

    yield make
    for rt in made:
        rt.close()
        rt.app.close()


def _deliver(rt: WorkerRuntime, run_id: UUID, seq: int) -> str:
    return rt.handle({"run_id": str(run_id), "seq": seq}).kind.value


def test_eager__runs_the_next_steps_in_process_then_publishes_one_message(
        ledger: Ledger, runtime: Factory, publisher: Publisher) -> None:
    """One delivered message with eager_steps=3 commits seq 0 and then three more steps of
    the same run in the same process (4 checkpoints, one committed attempt each, all by this
    worker, no stale delivery counted), then publishes exactly one message, for seq 4, whose
    outbox row is still in the ledger for the dispatcher should that publish be lost."""
    rt = runtime(eager_steps=3, eager_window_ms=60_000)
    run_id = ledger.start_run("test_chain", {"steps": 10})

    assert _deliver(rt, run_id, 0) == "committed"

    row = reads.run_row(ledger.engine, run_id)
    assert (row["seq"], row["status"], row["stale_deliveries"]) == (4, "running", 0)
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1, 2, 3, 4]
    assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1, 2: 1, 3: 1}
    assert {a["worker"] for a in reads.attempts(ledger.engine, run_id)} == {rt.worker_id}
    assert [r["seq"] for r in reads.outbox_rows(ledger.engine, run_id)] == [4]
    assert publisher.queued() == 1


def test_eager__each_commit_claims_the_next_step_in_its_own_transaction(
        ledger: Ledger, runtime: Factory, publisher: Publisher) -> None:
    """An eager step costs one transaction, not two: the commit of seq k claims seq k + 1
    for the same worker in the same statement, so the attempt of seq k + 1 starts at the
    very database time (the transaction's) the attempt of seq k ended, and no claim
    statement runs between them. The last commit within eager_steps=3 claims nothing and
    writes the outbox row its message is published from."""
    rt = runtime(eager_steps=3, eager_window_ms=60_000)
    run_id = ledger.start_run("test_chain", {"steps": 10})

    assert _deliver(rt, run_id, 0) == "committed"

    tried = reads.attempts(ledger.engine, run_id)
    assert [(a["seq"], a["attempt"], a["outcome"]) for a in tried] == [
        (s, 1, "committed") for s in range(4)]
    same_tx = [nxt["started_at"] == prev["ended_at"] for prev, nxt in pairwise(tried)]
    assert same_tx == [True, True, True]
    row = reads.run_row(ledger.engine, run_id)
    assert (row["seq"], row["lease_owner"], row["attempt"], row["attempts_total"]) == (
        4, None, 0, 4)
    assert [r["seq"] for r in reads.outbox_rows(ledger.engine, run_id)] == [4]
    assert publisher.queued() == 1


def test_eager__zero_sends_every_step_through_the_broker(
        ledger: Ledger, runtime: Factory, publisher: Publisher) -> None:
    """eager_steps=0: one message executes one step and publishes the next."""
    rt = runtime(eager_steps=0)
    run_id = ledger.start_run("test_chain", {"steps": 10})

    assert _deliver(rt, run_id, 0) == "committed"

    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1]
    assert publisher.queued() == 1


def test_eager__window_spent_hands_the_run_back_to_the_broker(
        ledger: Ledger, runtime: Factory, publisher: Publisher) -> None:
    """A step that outlasts eager_window_ms (here 50 ms against 20 ms) ends the eager
    continuation however many eager steps are left: one step, one message published."""
    rt = runtime(eager_steps=16, eager_window_ms=20)
    run_id = ledger.start_run("test_chain", {"steps": 10, "sleep_ms": 50})

    assert _deliver(rt, run_id, 0) == "committed"

    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1]
    assert publisher.queued() == 1


def test_eager__a_run_that_finishes_inside_the_budget_publishes_nothing(
        ledger: Ledger, runtime: Factory, publisher: Publisher) -> None:
    """A 5-step run delivered once with eager_steps=16 completes in that one delivery: five
    checkpoints after the first, the run completed, no outbox row and no message left."""
    rt = runtime(eager_steps=16, eager_window_ms=60_000)
    run_id = ledger.start_run("test_chain", {"steps": 5})

    assert _deliver(rt, run_id, 0) == "committed"

    row = reads.run_row(ledger.engine, run_id)
    assert (row["status"], row["seq"]) == ("completed", 5)
    assert reads.outbox_rows(ledger.engine, run_id) == []
    assert publisher.queued() == 0


def test_eager__a_ledger_error_in_an_eager_step_publishes_its_message(
        ledger: Ledger, runtime: Factory, publisher: Publisher,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The delivered step commits and, in the same statement, claims the eager step after
    it, which then fails outside its body (fault ``after_claim@second:raise``, standing for
    the ledger going away). The worker gives that lease back and publishes the step's
    message before the error propagates, so the run waits neither for the lease to expire
    nor for the dispatcher's grace period: the commit before it stands, and the message
    runs the step. (Before the lease was given back, the message was a counted no-op until
    the lease expired.)"""
    monkeypatch.setenv("ONWARD_FAULTS", "after_claim@second:raise")
    rt = runtime(eager_steps=16, eager_window_ms=60_000)
    run_id = ledger.start_run("test_pair", {})
    try:
        with pytest.raises(faults.InjectedFault):
            _deliver(rt, run_id, 0)
    finally:
        monkeypatch.delenv("ONWARD_FAULTS")
        faults.arm_from_env()

    row = reads.run_row(ledger.engine, run_id)
    assert (row["seq"], row["status"], row["lease_owner"]) == (1, "running", None)
    assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1}
    assert [(a["seq"], a["outcome"]) for a in reads.attempts(ledger.engine, run_id)] == [
        (0, "committed"), (1, "released")]
    assert publisher.queued() == 1

    assert _deliver(rt, run_id, 1) == "committed"  # the published message runs the step
    assert reads.run_row(ledger.engine, run_id)["status"] == "completed"


def test_eager__threads_share_one_runtime_and_a_bounded_connection_pool(
        ledger: Ledger, runtime: Factory, publisher: Publisher) -> None:
    """Eight threads drive one worker runtime at once (as a ``-P threads -c 4`` worker's
    pool does, only busier): 24 runs of 3 steps, each delivered once with eager_steps=1, so
    every delivery commits two steps and publishes the third step's message from its own
    thread. Every run ends at seq 2 with one committed attempt per seq, exactly 24 messages
    reach Redis, and the process never opened more than 4 ledger connections (the pool
    sized to the concurrency), however many threads asked at once."""
    rt = runtime(eager_steps=1, eager_window_ms=60_000)
    rt.concurrency = 4
    run_ids = [ledger.start_run("test_chain", {"steps": 3, "sleep_ms": 5}) for _ in range(24)]

    with ThreadPoolExecutor(max_workers=8) as threads:
        kinds = list(threads.map(lambda run_id: _deliver(rt, run_id, 0), run_ids))

    assert kinds == ["committed"] * 24
    for run_id in run_ids:
        assert reads.run_row(ledger.engine, run_id)["seq"] == 2
        assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1}
    assert publisher.queued() == 24
    assert rt.pool_size == 4
    assert rt.store.conn.connections_opened() <= 4
