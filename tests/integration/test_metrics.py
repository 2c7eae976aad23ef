"""Prometheus metrics are read from the ledger: after runs complete, a scrape of the real
`onward metrics` process reports them."""

from __future__ import annotations

import httpx

from ledger import Ledger, RunStatus
from tests.support.cluster import Cluster, wait_for


def _scrape(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_metrics__scrape_reports_ledger_counts(ledger: Ledger, cluster: Cluster) -> None:
    """Invariant: the exporter's counters equal what the ledger holds (runs by status,
    committed steps) and the step latency quantiles cover the recent commits."""
    cluster.dispatcher()
    cluster.worker(concurrency=2)
    run_ids = [ledger.start_run("test_chain", {"steps": 4}) for _ in range(3)]
    wait_for(lambda: all(ledger.get_run(r).status is RunStatus.COMPLETED for r in run_ids),
             timeout=60, what="3 runs to complete")
    port = 19464 + (abs(hash(cluster.env["ONWARD_QUEUE"])) % 500)
    exporter = cluster.command("metrics", ["metrics", "--port", str(port)])
    values = wait_for(lambda: _try(port), timeout=30, what="the exporter to answer",
                      seen=exporter.log)
    assert values['onward_runs{status="completed"}'] >= 3
    assert values["onward_steps_committed_total"] >= 12
    assert values['onward_step_duration_seconds{quantile="0.5"}'] > 0
    assert "onward_outbox_lag_seconds" in values


def _try(port: int) -> dict[str, float] | None:
    try:
        return _scrape(port)
    except httpx.HTTPError:
        return None
