"""Prometheus exposition (``onward metrics``): one process reads the ledger at each scrape.

Counters come from the ledger's own totals, so they survive worker restarts and need no
multiprocess aggregation across the prefork pool.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector
from sqlalchemy.engine import Engine

from ledger.db import wrap_driver_errors
from ledger.health import Health, health_txn


class LedgerCollector(Collector):
    def __init__(self, engine: Engine, latency_window_s: float = 300.0) -> None:
        self.engine = engine
        self.window = latency_window_s

    def snapshot(self) -> Health:
        with wrap_driver_errors("reading metrics"), self.engine.connect() as conn:
            return health_txn(conn, latency_window_s=self.window)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        h = self.snapshot()
        runs = GaugeMetricFamily("onward_runs", "Runs by status.", labels=["status"])
        for status, n in sorted(h.runs_by_status.items()):
            runs.add_metric([status], n)
        yield runs
        attempts = CounterMetricFamily("onward_step_attempts", "Step executions by outcome.",
                                       labels=["outcome"])
        for outcome, n in sorted(h.attempts_by_outcome.items()):
            attempts.add_metric([outcome], n)
        yield attempts
        yield CounterMetricFamily("onward_steps_committed", "Checkpoints committed by steps.",
                                  value=h.attempts_by_outcome.get("committed", 0))
        yield CounterMetricFamily("onward_stale_deliveries",
                                  "Step messages that found the run elsewhere (no-ops).",
                                  value=h.stale_deliveries)
        yield CounterMetricFamily("onward_restores",
                                  "Steps taken over after their worker was lost.",
                                  value=h.restores)
        yield GaugeMetricFamily("onward_oldest_active_checkpoint_age_seconds",
                                "Age of the oldest head checkpoint of a running or waiting run.",
                                value=h.oldest_active_checkpoint_age_s)
        yield GaugeMetricFamily("onward_unresolved_effects",
                                "Effects pending or accepted at the provider.",
                                value=h.unresolved_effects)
        yield GaugeMetricFamily("onward_oldest_unresolved_effect_age_seconds",
                                "Age of the oldest pending or accepted effect.",
                                value=h.oldest_unresolved_effect_age_s)
        yield GaugeMetricFamily("onward_outbox_due", "Outbox rows due and not yet consumed.",
                                value=h.outbox_due)
        yield GaugeMetricFamily("onward_outbox_lag_seconds",
                                "How long the oldest due row has waited for the dispatcher.",
                                value=h.outbox_lag_s)
        yield GaugeMetricFamily("onward_pending_approvals", "Approvals waiting for a person.",
                                value=h.pending_approvals)
        latency = GaugeMetricFamily("onward_step_duration_seconds",
                                    f"Committed step duration over the last {self.window:.0f}s.",
                                    labels=["quantile"])
        for q, seconds in sorted(h.step_seconds.items()):
            latency.add_metric([str(q)], seconds)
        yield latency


def serve_metrics(engine: Engine, port: int, host: str = "127.0.0.1") -> threading.Event:
    """Register the collector and serve /metrics until the returned event is set."""
    REGISTRY.register(LedgerCollector(engine))
    start_http_server(port, addr=host)
    return threading.Event()
