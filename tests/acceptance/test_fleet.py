"""``onward workers``: the live fleet as the workers advertise it in the ledger, and the
workflows with active runs that no live worker serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from ledger import Ledger, RunStatus
from tests.support.cluster import ROOT, Cluster, wait_for

pytestmark = pytest.mark.acceptance

FAST_ADS = {"ONWARD_WORKER_QUEUE_TTL_S": "3"}  # advertise every second


def _workers(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "console", "workers", "--json", *args], cwd=ROOT,
        env={**os.environ, **env, **FAST_ADS, "ONWARD_AUTH": "off",
             "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_workers__lists_live_workers_and_flags_unserved_workflows(
        ledger: Ledger, cluster: Cluster, settings_env: dict[str, str]) -> None:
    """Invariant: a running worker is listed with its host, main pid, pool, concurrency,
    every queue it consumes, the workflow versions it has, the step in flight and a fresh
    heartbeat; a workflow with an active run and no live worker is flagged (exit 1); a worker
    that stops cleanly leaves the list."""
    cluster.dispatcher()
    worker = cluster.worker(concurrency=2, env=FAST_ADS)
    # long enough that a poll (a CLI process, seconds on a busy machine) sees it in flight
    slow = ledger.start_run("test_chain", {"steps": 1, "sleep_ms": 20000})

    def in_flight() -> dict[str, Any] | None:
        code, view = _workers(settings_env)
        rows = [w for w in view["workers"] if w["pid"] == worker.pid]
        return view if code == 0 and rows and rows[0]["in_flight"] == 1 else None

    view = wait_for(in_flight, timeout=30, what="the worker to advertise one step in flight",
                    seen=lambda: _workers(settings_env))
    (row,) = [w for w in view["workers"] if w["pid"] == worker.pid]
    assert row["pool"] == "prefork" and row["concurrency"] == 2
    assert row["node"].startswith("worker-") and row["host"]
    queue = settings_env["ONWARD_QUEUE"]
    assert {queue, f"{queue}.test_five.v1", f"{queue}.test_chain"} <= set(row["queues"])
    assert {"workflow": "test_five", "version": 1, "start_step": "plan"} in row["workflows"]
    assert row["live"] is True and row["heartbeat_age_s"] < 3  # advertised each second
    assert view["unserved"] == []
    wait_for(lambda: ledger.get_run(slow).status is RunStatus.COMPLETED, timeout=90,
             what="the slow run to complete")

    ledger.start_run("ghost_workflow", {})
    code, view = _workers(settings_env)
    assert code == 1
    assert view["unserved"] == [{"workflow": "ghost_workflow", "version": None, "runs": 1,
                                 "workflow_served": False}]

    worker.stop(timeout=90)  # a clean stop (past 15 s on a loaded machine it was a SIGKILL)
    code, view = _workers(settings_env, "--all")
    assert [w for w in view["workers"] if w["pid"] == worker.pid] == []
