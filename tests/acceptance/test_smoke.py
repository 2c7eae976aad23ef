"""A batch of runs through real workers, dispatcher and reaper."""

from __future__ import annotations

import pytest

from ledger import Ledger, RunStatus
from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.acceptance


def test_engine__runs_complete_with_one_checkpoint_per_step(ledger: Ledger,
                                                            cluster: Cluster) -> None:
    """Every run of 10 steps ends completed with checkpoints 0..10, each committed once."""
    cluster.dispatcher()
    cluster.reaper()
    cluster.worker(concurrency=2)
    run_ids = [ledger.start_run("test_chain", {"steps": 10}) for _ in range(20)]

    def finished() -> bool:
        return all(ledger.get_run(r).status is RunStatus.COMPLETED for r in run_ids)

    wait_for(finished, timeout=60, what="20 runs to complete",
             seen=lambda: [ledger.get_run(r).status for r in run_ids])
    stats = ledger.batch_stats(run_ids)
    assert stats.completed == 20
    assert stats.steps_committed == 200
    assert stats.duplicate_commits == 0
    assert stats.runs_with_gaps == 0
    assert stats.completed_steps_reexecuted == 0
