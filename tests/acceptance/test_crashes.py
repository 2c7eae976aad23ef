"""Processes dying or hanging at the worst moments: the run still ends with exactly one
checkpoint per seq. Real ``onward`` processes are SIGKILLed / SIGSTOPped by pid, or die at
named fault points armed through ONWARD_FAULTS (each test has its own fault marker dir).

The crash tests run on the prefork pool (a pool child dies; Celery's parent replaces it) and
on the threads pool (the step runs in a thread of the worker process itself, so the whole
worker dies with it, other threads' steps included); a SIGKILL mid-step and a paused lease
holder also on the gevent pool."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from examples.model_server import answer_for
from ledger import Ledger
from tests.support import reads
from tests.support.cluster import Cluster, Proc, wait_for
from tests.support.messages import Publisher
from tests.support.model_server import ModelServer, running_model_server
from tests.support.provider import Provider, provider_fixture

pytestmark = pytest.mark.acceptance

POOLS = pytest.mark.parametrize("pool", ["prefork", "threads"])
ALL_POOLS = pytest.mark.parametrize("pool", ["prefork", "threads", "gevent"])
THREADS = 4  # a threads worker runs this many steps at once: the crash takes them all


def start_worker(cluster: Cluster, pool: str, **options: Any) -> Proc:
    """A worker of ``pool``: one prefork child, or one process of THREADS threads/greenlets."""
    return cluster.worker(concurrency=1 if pool == "prefork" else THREADS, pool=pool, **options)


def lease_holder(ledger: Ledger, run_id: UUID, workers: list[Proc]) -> tuple[Proc, int, str]:
    """The worker process whose pool child (prefork) or itself (threads) holds the run's
    lease right now (from runs.lease_owner = "host:pid"), that pid and the owner string."""

    def holder() -> tuple[Proc, int, str] | None:
        owner = reads.run_row(ledger.engine, run_id)["lease_owner"]
        if owner is None:
            return None
        pid = int(owner.rsplit(":", 1)[1])
        for proc in workers:
            if pid in proc.step_pids():
                return proc, pid, owner
        raise AssertionError(f"lease owner {owner} is not a child of any test worker")

    return wait_for(holder, timeout=60, what=f"a worker to lease run {run_id}", interval=0.02)


def _completed(ledger: Ledger, run_id: UUID, timeout: float = 90) -> dict[str, Any]:
    return reads.wait_run(ledger.engine, run_id, timeout=timeout, what="the run to complete",
                          status="completed")


@ALL_POOLS
def test_crash__sigkill_mid_step_completes_on_another_worker(ledger: Ledger, cluster: Cluster,
                                                             pool: str) -> None:
    """SIGKILL the pool child holding a run's lease while its 0.8 s step sleeps: after the
    3 s lease expires the reaper restores the run (restore_count >= 1, the dead attempt
    recorded 'worker_lost'), another process commits that seq, and the run completes
    with checkpoints 0..3, exactly one committed attempt per seq."""
    cluster.dispatcher()
    cluster.reaper()
    workers = [start_worker(cluster, pool, name="worker-a"),
               start_worker(cluster, pool, name="worker-b")]
    run_id = ledger.start_run("test_chain", {"steps": 3, "sleep_ms": 800})

    _, pid, owner = lease_holder(ledger, run_id, workers)
    killed_seq = reads.run_row(ledger.engine, run_id)["seq"]
    os.kill(pid, signal.SIGKILL)

    row = _completed(ledger, run_id)
    assert row["restore_count"] >= 1
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1, 2, 3]
    assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1, 2: 1}
    tried = reads.attempts(ledger.engine, run_id)
    lost = [a for a in tried if a["outcome"] == "worker_lost"]
    assert [(a["worker"], a["seq"]) for a in lost] == [(owner, killed_seq)]
    [winner] = [a for a in tried if a["seq"] == killed_seq and a["outcome"] == "committed"]
    assert winner["worker"] != owner and winner["attempt"] == 2
    assert {a["outcome"] for a in tried} == {"worker_lost", "committed"}
    stats = ledger.batch_stats([run_id])
    assert (stats.duplicate_commits, stats.runs_with_gaps) == (0, 0)


def test_crash__sigkill_mid_run_resumes_from_the_reconstructed_state(
        ledger: Ledger, cluster: Cluster) -> None:
    """SIGKILL the pool child holding a run whose checkpoints are deltas (a note appended
    per step; a snapshot every 3 steps at most), mid-step past its first snapshots: another
    worker restores the head by reading its snapshot and deltas, and the run completes with
    every note exactly once, in order, each written at its own seq; its history verifies."""
    cluster.dispatcher()
    cluster.reaper()
    env = {"ONWARD_CHECKPOINT_SNAPSHOT_EVERY": "3"}
    workers = [start_worker(cluster, "prefork", name="worker-a", env=env),
               start_worker(cluster, "prefork", name="worker-b", env=env)]
    run_id = ledger.start_run("test_notes_chain", {"steps": 8, "sleep_ms": 700})
    wait_for(lambda: reads.run_row(ledger.engine, run_id)["seq"] >= 5, timeout=90,
             what="the run to pass seq 5", interval=0.05)

    _, pid, owner = lease_holder(ledger, run_id, workers)
    killed_seq = reads.run_row(ledger.engine, run_id)["seq"]
    os.kill(pid, signal.SIGKILL)

    row = _completed(ledger, run_id)
    assert row["restore_count"] >= 1
    notes = row["result"]["notes"]
    assert [n.split(" .")[0] for n in notes] == [
        f"note {i} written at seq {i - 1}" for i in range(1, 9)]
    assert reads.committed_per_seq(ledger.engine, run_id) == {seq: 1 for seq in range(8)}
    lost = [a for a in reads.attempts(ledger.engine, run_id) if a["outcome"] == "worker_lost"]
    assert [(a["worker"], a["seq"]) for a in lost] == [(owner, killed_seq)]
    kinds = reads.checkpoint_kinds(ledger.engine, run_id)
    assert kinds[killed_seq] == "delta" and "snapshot" in list(kinds.values())[1:], kinds
    assert ledger.verify_run(run_id) == []


@POOLS
def test_crash__after_commit_before_publish_the_dispatcher_publishes(
        ledger: Ledger, cluster: Cluster, settings_env: dict[str, str], pool: str) -> None:
    """The worker dies (SIGKILL, fault after_commit_before_publish) right after committing
    seq 1 and before publishing its message: the outbox row committed with the checkpoint
    is published by the dispatcher after its grace period, so the run completes with no
    reaper running, no restore, every attempt committed and one checkpoint per seq. (On
    the threads pool the whole worker dies; a second worker is started after it.) Eager
    continuation is off: with it on, the commit claims the next step instead of
    publishing it (the next test)."""
    cluster.dispatcher()
    fault = {"ONWARD_EAGER_STEPS": "0", "ONWARD_FAULTS": "after_commit_before_publish:kill:once"}
    worker = start_worker(cluster, pool, env=fault)
    run_id = ledger.start_run("test_chain", {"steps": 3})
    if pool == "threads":
        wait_for(lambda: not worker.alive(), timeout=60, what="the worker to die at the fault")
        assert worker.popen.returncode == -signal.SIGKILL
        start_worker(cluster, pool, name="worker-b", env={"ONWARD_EAGER_STEPS": "0"})

    row = _completed(ledger, run_id)

    marker = Path(settings_env["ONWARD_FAULTS_DIR"]) / "after_commit_before_publish@*.kill.fired"
    assert marker.exists(), "the fault never fired"
    tried = reads.attempts(ledger.engine, run_id)
    assert tried[0]["worker"].endswith(f":{marker.read_text()}")  # seq 0's worker died
    assert [a["outcome"] for a in tried] == ["committed"] * 3
    assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1, 2: 1}
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1, 2, 3]
    assert row["restore_count"] == 0
    if pool == "prefork":
        assert "exited with 'signal 9 (SIGKILL)'" in worker.log()


@POOLS
def test_crash__after_a_commit_that_claimed_the_next_step_the_reaper_resumes_it(
        ledger: Ledger, cluster: Cluster, settings_env: dict[str, str], pool: str) -> None:
    """Eager continuation (the default): the commit of seq 0 also claims seq 1 for its
    worker, in the same statement, and writes no outbox row for it. The worker dies
    (SIGKILL, fault after_chained_commit) right after that commit, before running seq 1.
    Nothing was published and nothing is in the outbox: the lease it took expires, the
    reaper restores the run (once), and it completes with one checkpoint and one committed
    attempt per seq; the claimed attempt of seq 1 ends worker_lost, and nothing else. (A
    wide eager window: on a busy machine the first step can outlast the default 100 ms,
    and its commit then publishes instead of claiming.)"""
    cluster.dispatcher()
    cluster.reaper()
    fault = {"ONWARD_FAULTS": "after_chained_commit:kill:once",
             "ONWARD_EAGER_WINDOW_MS": "600000"}
    worker = start_worker(cluster, pool, env=fault)
    run_id = ledger.start_run("test_chain", {"steps": 3})
    if pool == "threads":
        wait_for(lambda: not worker.alive(), timeout=60, what="the worker to die at the fault")
        assert worker.popen.returncode == -signal.SIGKILL
        start_worker(cluster, pool, name="worker-b", env={"ONWARD_EAGER_WINDOW_MS": "600000"})

    row = _completed(ledger, run_id)

    marker = Path(settings_env["ONWARD_FAULTS_DIR"]) / "after_chained_commit@*.kill.fired"
    assert marker.exists(), "the fault never fired"
    tried = reads.attempts(ledger.engine, run_id)
    died = marker.read_text()
    assert [(a["seq"], a["outcome"]) for a in tried if a["worker"].endswith(f":{died}")] == [
        (0, "committed"), (1, "worker_lost")]  # seq 1 was claimed by seq 0's commit
    assert [(a["seq"], a["outcome"]) for a in tried if a["outcome"] != "committed"] == [
        (1, "worker_lost")]
    assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1, 2: 1}
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1, 2, 3]
    assert row["restore_count"] == 1
    if pool == "prefork":
        assert "exited with 'signal 9 (SIGKILL)'" in worker.log()


@POOLS
def test_crash__sigkill_during_an_eager_step_completes_elsewhere(ledger: Ledger,
                                                                cluster: Cluster,
                                                                pool: str) -> None:
    """One delivered message runs a run's steps back to back in the same pool child (eager
    continuation, a wide window). SIGKILL that child while it is inside the third step,
    which no broker message asked for: the commits before it stand, the lease expires, the
    reaper restores the run, the other worker finishes it, and every seq has exactly one
    checkpoint and one committed attempt."""
    cluster.dispatcher()
    cluster.reaper()
    eager = {"ONWARD_EAGER_STEPS": "16", "ONWARD_EAGER_WINDOW_MS": "600000"}
    first = start_worker(cluster, pool, name="worker-a", env=eager)
    run_id = ledger.start_run("test_chain", {"steps": 5, "sleep_ms": 300})

    def in_third_step() -> int | None:
        row = reads.run_row(ledger.engine, run_id)
        return row["lease_epoch"] if row["seq"] == 2 and row["lease_owner"] else None

    wait_for(in_third_step, timeout=60, what="the run to be in its third step", interval=0.02)
    tried = reads.attempts(ledger.engine, run_id)
    owners = {a["worker"] for a in tried}
    assert len(owners) == 1, f"seq 0..2 were not all run by one process: {tried}"
    assert first.log().count("] received") == 1  # one message, three steps
    owner = owners.pop()
    os.kill(int(owner.rsplit(":", 1)[1]), signal.SIGKILL)
    start_worker(cluster, pool, name="worker-b")

    row = _completed(ledger, run_id)
    assert row["restore_count"] >= 1
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1, 2, 3, 4, 5]
    assert reads.committed_per_seq(ledger.engine, run_id) == {s: 1 for s in range(5)}
    lost = [(a["seq"], a["outcome"]) for a in reads.attempts(ledger.engine, run_id)
            if a["outcome"] != "committed"]
    assert lost == [(2, "worker_lost")]


def test_crash__dispatcher_dies_after_publish_before_mark_duplicate_is_noop(
        ledger: Ledger, cluster: Cluster, publisher: Publisher) -> None:
    """A dispatcher SIGKILLed after publishing a row and before marking it leaves the row
    unmarked, so the next dispatcher publishes it again: two identical messages sit in
    Redis. The worker claims one and counts the other as a stale delivery; the run
    completes with one committed attempt per seq (later steps go by the worker's own
    fast-path publish)."""
    first = cluster.dispatcher(env={"ONWARD_FAULTS":
                                    "dispatcher_after_publish_before_mark:kill:once"})
    run_id = ledger.start_run("test_chain", {"steps": 2})
    wait_for(lambda: not first.alive(), timeout=60, what="the dispatcher to die at the fault")
    assert first.popen.returncode == -signal.SIGKILL
    assert publisher.queued() == 1
    [row] = reads.outbox_rows(ledger.engine, run_id)
    assert (row["published_at"], row["publish_count"]) == (None, 0)

    second = cluster.dispatcher()
    wait_for(lambda: reads.outbox_rows(ledger.engine, run_id)[0]["published_at"] is not None,
             timeout=60, what="the second dispatcher to publish and mark the row")
    assert publisher.queued() == 2
    # Stop it, or it would republish the row once it has been published for
    # ONWARD_OUTBOX_REPUBLISH_S while the worker below starts: a third message, also a no-op,
    # but the count asserted here would then depend on how busy the machine is.
    second.stop()

    cluster.worker(concurrency=2)
    done = reads.wait_run(ledger.engine, run_id, timeout=60, status="completed",
                          what="the run to complete and the duplicate to be counted",
                          until=lambda r: r["stale_deliveries"] == 1)
    assert done["attempts_total"] == 2
    assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1}
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1, 2]
    wait_for(lambda: publisher.queued() == 0, timeout=30, what="the queue to drain")


@ALL_POOLS
def test_crash__paused_lease_holder_cannot_commit_after_takeover(ledger: Ledger,
                                                                 cluster: Cluster,
                                                                 pool: str) -> None:
    """SIGSTOP the pool child holding a run's lease past the 3 s TTL: the reaper restores
    the run, the other worker claims it (new lease epoch) and completes it. SIGCONT the
    paused child: its step finishes, its commit is fenced off by the epoch, its attempt
    ends 'lease_lost', and there is still exactly one checkpoint per seq."""
    cluster.dispatcher()
    cluster.reaper()
    workers = [start_worker(cluster, pool, name="worker-a"),
               start_worker(cluster, pool, name="worker-b")]
    run_id = ledger.start_run("test_chain", {"steps": 2, "sleep_ms": 1500})

    paused, pid, owner = lease_holder(ledger, run_id, workers)
    stalled = reads.run_row(ledger.engine, run_id)
    os.kill(pid, signal.SIGSTOP)
    try:
        row = _completed(ledger, run_id)
    finally:
        os.kill(pid, signal.SIGCONT)

    assert row["restore_count"] >= 1
    assert row["lease_epoch"] > stalled["lease_epoch"]
    wait_for(lambda: f"run_id={run_id}" in paused.log()
             and "lease lost before commit" in paused.log(), timeout=60,
             what="the resumed child to find its lease lost")
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1, 2]
    assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1}
    assert all(a["worker"] != owner for a in reads.attempts(ledger.engine, run_id)
               if a["outcome"] == "committed")
    zombie = next(a for a in reads.attempts(ledger.engine, run_id)
                  if a["lease_epoch"] == stalled["lease_epoch"])
    assert zombie["worker"] == owner
    assert zombie["outcome"] == "lease_lost"


def test_crash__poison_step_parks_after_max_attempts(ledger: Ledger, cluster: Cluster,
                                                     publisher: Publisher) -> None:
    """A step that SIGKILLs its worker every time is tried max_attempts (3) times, each
    attempt recorded 'worker_lost', then parked as needs_review ('attempts_exhausted') with
    the last error naming the step and the attempts. No hot loop: attempts_total never
    exceeds max_attempts, and a later delivery is a counted no-op."""
    cluster.dispatcher()
    cluster.reaper()
    worker = cluster.worker(concurrency=2)
    run_id = ledger.start_run("test_poison", {})

    row = reads.wait_run(ledger.engine, run_id, timeout=90, status="needs_review",
                         what="the poison run to be parked")

    assert row["parked_reason"] == "attempts_exhausted"
    assert row["attempts_total"] == row["max_attempts"] == 3
    assert row["restore_count"] == 2
    assert row["last_error"]["type"] == "WorkerLost"
    assert "lost its worker on all 3 attempts" in row["last_error"]["message"]
    assert "(start)" in row["last_error"]["message"]
    tried = reads.attempts(ledger.engine, run_id)
    assert [(a["attempt"], a["outcome"]) for a in tried] == [
        (1, "worker_lost"), (2, "worker_lost"), (3, "worker_lost")]
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0]

    stale = row["stale_deliveries"]
    publisher.step(run_id, 0)
    after = reads.wait_run(ledger.engine, run_id, timeout=30, what="the late delivery",
                           until=lambda r: r["stale_deliveries"] > stale)
    assert (after["attempts_total"], after["status"]) == (3, "needs_review")
    assert len(reads.attempts(ledger.engine, run_id)) == 3
    assert worker.alive()


@POOLS
def test_crash__after_an_unrecordable_answer_is_refused_the_model_is_not_called_again(
        ledger: Ledger, cluster: Cluster, settings_env: dict[str, str], tmp_path: Path,
        pool: str) -> None:
    """Issue 10, F9. The model answers with a NUL character, which the ledger cannot
    record: the answer's spend is debited and its refusal recorded in one statement, and
    the worker is SIGKILLed right then (fault after_answer_refused), before the run is
    failed. The reaper restores the run, the next attempt finds the refusal and fails the
    run ``invalid_answer`` without calling: the model was called (and paid) once, debited
    once (before: the retry called it again, and paid again: 2 calls, 120 tokens)."""
    paid = tmp_path / "paid.log"
    env = {"ONWARD_WORKFLOWS": "tests.workflows_inputs", "ONWARD_FAKE_LLM_LOG": str(paid)}
    cluster.dispatcher(env=env)
    cluster.reaper(env=env)
    worker = start_worker(cluster, pool, env={**env,
                                              "ONWARD_FAULTS": "after_answer_refused:kill:once"})
    run_id = ledger.start_run("test_bad_input", {"kind": "nul_answer"})
    if pool == "threads":
        wait_for(lambda: not worker.alive(), timeout=60, what="the worker to die at the fault")
        assert worker.popen.returncode == -signal.SIGKILL
        start_worker(cluster, pool, name="worker-b", env=env)

    row = reads.wait_run(ledger.engine, run_id, timeout=90, status="failed",
                         what="the run to fail invalid_answer")

    marker = Path(settings_env["ONWARD_FAULTS_DIR"]) / "after_answer_refused@*.kill.fired"
    assert marker.exists(), "the fault never fired"
    assert len(paid.read_text().splitlines()) == 1  # the provider was called once
    assert row["last_error"]["reason"] == "invalid_answer"
    assert (row["used_tokens"], float(row["used_cost_usd"])) == (60, 0.6)
    assert [a["outcome"] for a in reads.attempts(ledger.engine, run_id)] == ["worker_lost",
                                                                             "failed"]


# -- a model call whose evidence look-up was skipped (tests/workflows_lookup.py) -------------
# The step ``ask`` is claimed by the commit of the step before it (eager continuation), which
# found no answer at its seq: its model call sends no look-up first. The ledger must still
# hold one answer per call, the one the step used, and the effect after it must be made once.

TOPIC = "lookups skipped under crashes"


provider = provider_fixture()


def _lookup_env(model: ModelServer, provider: Provider, **extra: str) -> dict[str, str]:
    """The call's 8 s limit and a 1 s margin fit in ask's 13 s lease (its 12 s timeout and
    the margin): covered by the chained claim; a wide eager window, so the commit claims ask."""
    return {"ONWARD_WORKFLOWS": "tests.workflows_lookup", "ONWARD_MODEL_URL": model.url,
            "ONWARD_EXAMPLE_PROVIDER_URL": provider.url, "ONWARD_TEST_MODEL_TIMEOUT_S": "8",
            "ONWARD_TOOL_LEASE_MARGIN_S": "1", "ONWARD_EAGER_WINDOW_MS": "600000", **extra}


def _answer(salt: str) -> str:
    """What the model server answers ask's call while its salt is ``salt``."""
    answer = answer_for("gpt-test", [{"role": "user", "content": TOPIC}], None, salt=salt)
    return str(answer["choices"][0]["message"]["content"])


def _evidence(ledger: Ledger, run_id: UUID) -> list[dict[str, Any]]:
    with ledger.engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT seq, command_id, response FROM onward.evidence WHERE run_id = :id "
            "ORDER BY seq, created_at"), {"id": run_id}).mappings()]


def _claimed_by_the_commit(ledger: Ledger, run_id: UUID, worker: Proc) -> str:
    """The worker that runs ask got one message, seq 0's (prepare): seq 1 was claimed by
    seq 0's commit, as its attempt says (same holder, the next lease); that holder. On
    prefork, Celery's parent may already have received that same message again (the child
    that died held it, unacknowledged): the same task id, not a message for ask."""
    received = set(re.findall(r"Task (\S+)\[([0-9a-f-]+)\] received", worker.log()))
    assert {name for name, _ in received} == {"test_skip_chained.prepare"} \
        and len(received) == 1, received
    zero, one = reads.attempts(ledger.engine, run_id)[:2]
    assert (zero["seq"], zero["outcome"], one["seq"]) == (0, "committed", 1)
    assert one["worker"] == zero["worker"] and one["lease_epoch"] == zero["lease_epoch"] + 1
    return str(one["worker"])


def _replaced(cluster: Cluster, pool: str, worker: Proc, env: dict[str, str]) -> None:
    """On the threads pool the whole worker died: start another (prefork: Celery's parent
    replaces its child itself)."""
    if pool == "threads":
        wait_for(lambda: not worker.alive(), timeout=60, what="the worker to die")
        start_worker(cluster, pool, name="worker-b", env=env)


@POOLS
def test_crash__sigkill_during_a_call_that_skipped_its_look_up_asks_again_records_once(
        ledger: Ledger, cluster: Cluster, provider: Provider, tmp_path: Path,
        pool: str) -> None:
    """SIGKILL the process running ask while the model server holds its call (6 s, so a
    busy machine still kills it inside), the call sent with no look-up before it. Nothing
    was recorded, so the next attempt (after the reaper restores the run) asks again: the
    server saw 2 calls, and its answer changed meanwhile (another salt). The ledger holds
    one answer at seq 1, the second call's; the run's result is that answer; one object at
    the provider."""
    with running_model_server(tmp_path / "model", "--latency-ms", "6000",
                              "--jitter", "0") as model:
        env = _lookup_env(model, provider)
        cluster.dispatcher(env=env)
        cluster.reaper(env=env)
        first = start_worker(cluster, pool, name="worker-a", env=env)
        run_id = ledger.start_run("test_skip_chained", {"topic": TOPIC})
        wait_for(lambda: model.stats()["inflight"] == 1, timeout=60,
                 what="ask's model call to be held", interval=0.02)
        _, pid, owner = lease_holder(ledger, run_id, [first])
        os.kill(pid, signal.SIGKILL)
        held = model.stats()
        model.configure(salt="after the crash", latency_ms=200)
        assert held["completed"] == 0, f"the call was answered before the kill: {held}"
        assert _claimed_by_the_commit(ledger, run_id, first) == owner
        _replaced(cluster, pool, first, env)

        row = _completed(ledger, run_id)
        stats = model.stats()
        calls = stats["requests"]

    assert calls == 2, stats  # killed before its answer was recorded: asked again
    [recorded] = _evidence(ledger, run_id)
    assert (recorded["seq"], recorded["command_id"]) == (1, "ask@1#1")
    assert recorded["response"]["text"] == _answer("after the crash") != _answer("")
    assert row["result"]["answer"] == recorded["response"]["text"]
    assert provider.stats()["by_collection"] == {"skip_offers": 1}
    lost = [(a["worker"], a["seq"]) for a in reads.attempts(ledger.engine, run_id)
            if a["outcome"] != "committed"]
    assert lost == [(owner, 1)]
    assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1}


@POOLS
def test_crash__sigkill_after_a_skipped_look_ups_answer_is_recorded_reuses_it(
        ledger: Ledger, cluster: Cluster, provider: Provider, settings_env: dict[str, str],
        tmp_path: Path, pool: str) -> None:
    """ask calls the model with no look-up before it, records the answer, makes its effect,
    and its process is SIGKILLed before the commit (fault before_checkpoint_commit@ask).
    The next attempt finds the answer recorded (its claim says so) and does not ask again,
    though the server would now answer otherwise (another salt): one call, one answer at
    seq 1, the run's result is that first answer, one object at the provider."""
    with running_model_server(tmp_path / "model", "--latency-ms", "200",
                              "--jitter", "0") as model:
        env = _lookup_env(model, provider)
        cluster.dispatcher(env=env)
        cluster.reaper(env=env)
        first = start_worker(cluster, pool, name="worker-a", env={
            **env, "ONWARD_FAULTS": "before_checkpoint_commit@ask:kill:once"})
        run_id = ledger.start_run("test_skip_chained", {"topic": TOPIC})
        marker = Path(settings_env["ONWARD_FAULTS_DIR"])
        wait_for(lambda: list(marker.glob("before_checkpoint_commit@*.kill.fired")),
                 timeout=60, what="the fault to fire")
        owner = _claimed_by_the_commit(ledger, run_id, first)
        model.configure(salt="after the crash")
        _replaced(cluster, pool, first, env)

        row = _completed(ledger, run_id)
        stats = model.stats()
        calls = stats["requests"]

    assert calls == 1, stats  # the recorded answer is used: no second call
    [recorded] = _evidence(ledger, run_id)
    assert (recorded["seq"], recorded["command_id"]) == (1, "ask@1#1")
    assert recorded["response"]["text"] == _answer("") == row["result"]["answer"]
    assert provider.stats()["by_collection"] == {"skip_offers": 1}
    lost = [(a["worker"], a["seq"]) for a in reads.attempts(ledger.engine, run_id)
            if a["outcome"] != "committed"]
    assert lost == [(owner, 1)]
    assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1}
