"""Prometheus metrics are read from the ledger: after runs complete, a scrape of the real
`onward metrics` process reports them."""

from __future__ import annotations

import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ledger import Ledger, RunStatus
from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.acceptance


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> dict[str, float]:
    """Samples by name and labels, e.g. ``onward_runs{status="completed"}``."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def test_metrics__scrape_reports_ledger_counts(ledger: Ledger, cluster: Cluster) -> None:
    """Invariant: per workflow and version, the exporter's counters equal what the workers
    did (steps committed, runs finished, the duration histogram's count) once their
    counters are flushed, and its gauges what the ledger holds now (runs not finished,
    live workers, unserved runs); nothing is labelled by run."""
    cluster.dispatcher()
    cluster.worker(concurrency=2)
    run_ids = [ledger.start_run("test_chain", {"steps": 4}) for _ in range(3)]
    ledger.start_run("ghost_workflow", {})
    wait_for(lambda: all(ledger.get_run(r).status is RunStatus.COMPLETED for r in run_ids),
             timeout=60, what="3 runs to complete")
    port = _free_port()
    exporter = cluster.command("metrics", ["metrics", "--port", str(port)])
    chain = 'version="1",workflow="test_chain"'
    values = wait_for(lambda: (lambda v: v if v and v.get(
        f"onward_steps_committed_total{{{chain}}}") == 12 else None)(_try(port)),
        timeout=30, what="the exporter to report 12 committed steps", seen=lambda: _try(port))
    assert values[f'onward_runs_finished_total{{status="completed",{chain}}}'] == 3
    assert values[f'onward_step_duration_seconds_count{{{chain}}}'] == 12
    assert values[f'onward_step_duration_seconds_bucket{{le="+Inf",{chain}}}'] == 12
    assert values[f'onward_step_attempts_total{{outcome="committed",{chain}}}'] == 12
    assert values['onward_runs{status="running",version="0",workflow="ghost_workflow"}'] == 1
    assert values['onward_unserved_runs{version="0",workflow="ghost_workflow"}'] == 1
    assert values["onward_workers_live"] == 1
    assert not any("run_id" in name for name in values)
    assert "onward_scrape_duration_seconds" in values
    exporter.stop()


def _try(port: int) -> dict[str, float] | None:
    try:
        return _scrape(port)
    except httpx.HTTPError:
        return None
