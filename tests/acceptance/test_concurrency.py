"""Two worker processes competing for the same runs: one lease per step, one commit per
seq, at scale. Both tests share the module's two ``onward worker`` processes (prefork,
2 children each); the batch test adds a dispatcher and a reaper for its own duration."""

from __future__ import annotations

import re
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger
from tests.support import reads
from tests.support.cluster import Cluster, Proc, wait_for
from tests.support.messages import Publisher

pytestmark = pytest.mark.acceptance


@pytest.fixture()
def settings_env(module_env: dict[str, str]) -> dict[str, str]:
    return module_env


@pytest.fixture(scope="module")
def workers(module_cluster: Cluster) -> list[Proc]:
    return [module_cluster.worker(concurrency=2, name="worker-a"),
            module_cluster.worker(concurrency=2, name="worker-b")]


def _owners(workers: list[Proc], run_ids: list[UUID], ledger: Ledger) -> dict[str, int]:
    """Committed steps per worker process (by the pool children's pids)."""
    children = {pid: proc.name for proc in workers for pid in proc.children()}
    counts = {proc.name: 0 for proc in workers}
    with ledger.engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT worker, count(*) FROM onward.step_attempts WHERE run_id = ANY(:ids) "
            "AND outcome = 'committed' GROUP BY worker"), {"ids": run_ids}).all()
    for worker, count in rows:
        name = children.get(int(worker.rsplit(":", 1)[1]))
        assert name is not None, f"{worker} is not a child of a test worker"
        counts[name] += int(count)
    return counts


def test_race__two_workers_one_lease_the_loser_noops(
        ledger: Ledger, publisher: Publisher, shared_cluster: Cluster,
        workers: list[Proc]) -> None:
    """Each of 12 runs gets its seq-0 message 4 times at once, consumed by 4 pool children
    in 2 worker processes while the step sleeps 300 ms: exactly one delivery per run wins
    the lease and commits; the 3 others are counted stale (some of them while the lease was
    held: 'leased'), and every seq is committed exactly once."""
    run_ids = [ledger.start_run("test_chain", {"steps": 2, "sleep_ms": 300})
               for _ in range(12)]
    for run_id in run_ids:  # copies back to back, so that idle children take them together
        for _ in range(4):
            publisher.step(run_id, 0)

    wait_for(lambda: all(reads.run_row(ledger.engine, r)["status"] == "completed"
                         and reads.run_row(ledger.engine, r)["stale_deliveries"] == 3
                         for r in run_ids),
             timeout=120, what="every run to complete with 3 stale deliveries",
             seen=lambda: ledger.batch_stats(run_ids).as_dict())

    for run_id in run_ids:
        row = reads.run_row(ledger.engine, run_id)
        assert (row["attempts_total"], row["lease_epoch"], row["stale_deliveries"]) == (2, 2, 3)
        assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1}
        assert [a["outcome"] for a in reads.attempts(ledger.engine, run_id)] == ["committed"] * 2
    ids = {str(r) for r in run_ids}
    leased = [line for proc in workers for line in proc.log().splitlines()
              if "reason=leased" in line
              and (m := re.search(r"run_id=(\S+)", line)) and m.group(1) in ids]
    assert leased, "no delivery ever met a held lease: the race did not happen"
    assert all(count > 0 for count in _owners(workers, run_ids, ledger).values())


def test_batch__200_runs_of_10_steps_on_two_workers_exactly_once(
        ledger: Ledger, shared_cluster: Cluster, workers: list[Proc]) -> None:
    """200 runs of 10 steps through a dispatcher, a reaper and two worker processes end
    completed with checkpoints seq 0..10 (11 rows) per run: 2000 committed steps, no gap,
    no duplicate commit, no completed step executed again; both workers did work."""
    extra = [shared_cluster.dispatcher(), shared_cluster.reaper()]
    try:
        run_ids = [ledger.start_run("test_chain", {"steps": 10}) for _ in range(200)]
        wait_for(lambda: ledger.batch_stats(run_ids).completed == 200, timeout=400,
                 interval=0.5, what="200 runs to complete",
                 seen=lambda: ledger.batch_stats(run_ids).as_dict())
    finally:
        for proc in extra:
            proc.stop()

    stats = ledger.batch_stats(run_ids)
    assert stats.runs == stats.completed == 200
    assert stats.steps_committed == 2000
    assert (stats.duplicate_commits, stats.runs_with_gaps, stats.completed_steps_reexecuted,
            stats.failed, stats.parked) == (0, 0, 0, 0, 0)
    with ledger.engine.connect() as conn:
        shapes = conn.execute(sa.text("""
            SELECT count(*) AS n, min(seq) AS lo, max(seq) AS hi, count(DISTINCT seq) AS d
              FROM onward.checkpoints WHERE run_id = ANY(:ids) GROUP BY run_id"""),
            {"ids": run_ids}).all()
        committed = conn.execute(sa.text("""
            SELECT count(*) FROM onward.step_attempts
             WHERE run_id = ANY(:ids) AND outcome = 'committed'"""),
            {"ids": run_ids}).scalar_one()
    assert len(shapes) == 200
    assert {tuple(shape) for shape in shapes} == {(11, 0, 10, 11)}
    assert committed == 2000
    assert all(count > 0 for count in _owners(workers, run_ids, ledger).values())
