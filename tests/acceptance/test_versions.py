"""Deploys never strand or misread a run in flight: versions side by side, migrations on
resume, and parking when no path exists. Each tests/versions module is one deploy."""

from __future__ import annotations

from uuid import UUID

import pytest

from ledger import Ledger, RunStatus
from tests.support import reads
from tests.support.cluster import Cluster, Proc, wait_for

pytestmark = pytest.mark.acceptance

FAST = {"ONWARD_WORKER_QUEUE_TTL_S": "3"}


def deploy(cluster: Cluster, module: str, name: str) -> Proc:
    return cluster.worker(concurrency=1, name=name, env={**FAST, "ONWARD_WORKFLOWS": module})


def services(cluster: Cluster) -> None:
    env = {**FAST, "ONWARD_WORKFLOWS": "tests.versions.v1"}
    cluster.dispatcher(env=env)
    cluster.reaper(env=env)


def waiting(ledger: Ledger, runs: list[UUID]) -> None:
    wait_for(lambda: all(ledger.get_run(r).status is RunStatus.WAITING for r in runs),
             timeout=60, what="runs to wait for their signal",
             seen=lambda: [ledger.get_run(r).status for r in runs])


def finished(ledger: Ledger, runs: list[UUID], status: RunStatus = RunStatus.COMPLETED) -> None:
    wait_for(lambda: all(ledger.get_run(r).status is status for r in runs), timeout=90,
             what=f"runs to be {status.value}",
             seen=lambda: [(ledger.get_run(r).status, ledger.get_run(r).last_error)
                           for r in runs])


def test_versions__old_and_new_runs_finish_on_their_own_code(ledger: Ledger,
                                                            cluster: Cluster) -> None:
    """Invariant: with v1 and v2 workers side by side, every run started on v1 finishes on
    v1 and every run started on v2 finishes on v2, though v2 declares no compatibility."""
    services(cluster)
    old_worker = deploy(cluster, "tests.versions.v1", "v1")
    old_runs = [ledger.start_run("test_versioned", {}) for _ in range(3)]
    waiting(ledger, old_runs)
    old_worker.stop()
    new_worker = deploy(cluster, "tests.versions.v2", "v2")
    new_runs = [ledger.start_run("test_versioned", {}) for _ in range(3)]
    waiting(ledger, new_runs)
    deploy(cluster, "tests.versions.v1", "v1-again")  # the old code keeps serving old runs
    wait_for(lambda: len(reads.live_queues(ledger.engine)) >= 2, timeout=30,
             what="both version queues to be advertised")
    for run_id in old_runs + new_runs:
        ledger.signal(run_id, "go")
    finished(ledger, old_runs + new_runs)
    for run_id in old_runs:
        assert ledger.get_run(run_id).result["ran"] == ["begin@v1", "end@v1"]
    for run_id in new_runs:
        assert ledger.get_run(run_id).result["ran"] == ["begin@v2", "end@v2"]
    assert new_worker.alive()


def test_versions__migration_chain_applied_on_resume(ledger: Ledger, cluster: Cluster) -> None:
    """Invariant: a v1 run (state schema 1) resumed by v3 code (schema 3) is migrated 1→2→3
    at the seq it waited at (no checkpoint is added, no step renumbered), the step runs
    on the migrated state, its checkpoint records where the state came from, and the run
    finishes under v3 with the migrated state."""
    services(cluster)
    old_worker = deploy(cluster, "tests.versions.v1", "v1")
    run_id = ledger.start_run("test_versioned", {"name": "grace"})
    waiting(ledger, [run_id])
    old_worker.stop()
    deploy(cluster, "tests.versions.v3", "v3")
    ledger.signal(run_id, "go")
    finished(ledger, [run_id])
    run = ledger.get_run(run_id)
    assert (run.workflow_version, run.state_schema_version) == (3, 3)
    assert run.result["ran"] == ["begin@v1", "end@v3"]
    assert run.result["state"]["full_name"] == "grace"
    assert run.result["state"]["greeting"] == "hello grace"
    outcomes = reads.checkpoint_outcomes(ledger.engine, run_id)
    assert outcomes == ["start", "wait", "finish"]
    migrated = ledger.checkpoints(run_id)[-1].compatibility.migrated_from
    assert migrated is not None
    assert (migrated.workflow_version, migrated.state_schema_version) == (1, 1)
    assert ledger.verify_run(run_id) == []


def test_versions__missing_migration_parks(ledger: Ledger, cluster: Cluster) -> None:
    """Invariant: code with no complete migration path never runs a stored run under a
    meaning it did not have, nor restarts it: the run is parked incompatible_version at the
    seq it had reached."""
    services(cluster)
    old_worker = deploy(cluster, "tests.versions.v1", "v1")
    run_id = ledger.start_run("test_versioned", {})
    waiting(ledger, [run_id])
    seq = ledger.get_run(run_id).seq
    old_worker.stop()
    deploy(cluster, "tests.versions.v3_incomplete", "v3-broken")
    ledger.signal(run_id, "go")
    finished(ledger, [run_id], RunStatus.NEEDS_REVIEW)
    run = ledger.get_run(run_id)
    assert run.parked_reason == "incompatible_version"
    assert "no complete migration path" in run.last_error["message"]
    assert run.seq == seq and run.workflow_version == 1
