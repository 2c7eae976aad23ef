"""The ledger's own counts of what went wrong in a batch (``Ledger.batch_stats``), which the
demo, the acceptance tests and the benchmarks assert to be zero: here each is provoked by
editing rows directly, so those zero checks are shown able to fail."""

from __future__ import annotations

from uuid import UUID

from ledger import Ledger, OutcomeKind
from ledger.steps import Advance, Claim, StepStore
from tests.support import reads


def _commit_first_step(ledger: Ledger, store: StepStore, run_id: UUID) -> None:
    claim = store.claim(run_id, 0, "w:1")
    assert isinstance(claim, Claim)
    assert store.commit(claim, Advance(step="tick", outcome=OutcomeKind.GOTO, next_step="tick",
                                       state={"steps": 3, "done": 1, "sleep_ms": 0},
                                       workflow_version=1, next_max_attempts=3))


def test_batch_stats__counts_gaps_duplicate_commits_and_reexecutions(ledger: Ledger) -> None:
    """Three runs at seq 1: a clean one; one whose checkpoint 1 is deleted (a gap); one with
    a second 'committed' attempt of seq 0 that started after checkpoint 1 was written (a
    duplicate commit and a completed step executed again). Each count is exactly 1, the
    clean run adds nothing, and a batch of the clean run alone is all zeros."""
    store = StepStore(ledger.url, ledger.keys, lease_ttl_s=3.0)
    try:
        clean, gap, twice = (ledger.start_run("test_chain", {"steps": 3}) for _ in range(3))
        for run_id in (clean, gap, twice):
            _commit_first_step(ledger, store, run_id)
    finally:
        store.close()
    reads.execute(ledger.engine, "DELETE FROM onward.checkpoints WHERE run_id = :r AND seq = 1",
                  r=gap)
    reads.execute(ledger.engine,
                  "INSERT INTO onward.step_attempts (run_id, lease_epoch, seq, attempt, step, "
                  "worker, started_at, ended_at, outcome) VALUES (:r, 99, 0, 2, 'tick', 'w:2', "
                  "now() + interval '1 second', now() + interval '2 seconds', 'committed')",
                  r=twice)

    stats = ledger.batch_stats([clean, gap, twice])

    assert (stats.runs, stats.steps_committed) == (3, 2)
    assert stats.runs_with_gaps == 1
    assert stats.duplicate_commits == 1
    assert stats.completed_steps_reexecuted == 1
    alone = ledger.batch_stats([clean]).as_dict()
    assert {k: v for k, v in alone.items() if v} == {"runs": 1, "steps_committed": 1}
