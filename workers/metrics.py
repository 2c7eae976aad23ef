"""Prometheus exposition (``onward metrics``): one process reads the ledger at each scrape.

Labels are workflow and version (``version="0"``: a run's first step, before it is bound
to a version), never a run. Counters are the totals worker processes add to the ledger
every few seconds (``workers/meter.py``), so they survive worker restarts and need no
multiprocess aggregation; gauges count what is active now. Alert rules and a dashboard are
in ``deploy/``; what each alert means and what to do, in ``docs/runbook.md``.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import REGISTRY, Collector

from ledger.db import Engine
from ledger.health import Health, read_health
from ledger.vocabulary import RunStatus, WaitKind
from workers.meter import BUCKETS

__all__ = ["WV", "LedgerCollector", "serve_metrics"]


WV = ["workflow", "version"]

# metric_totals rows exposed as counters: metric -> (name, help, label name or None)
_COUNTERS = {
    "steps_committed": ("onward_steps_committed", "Checkpoints committed by steps.", None),
    "step_outcomes": ("onward_step_attempts", "Step executions by how they ended.", "outcome"),
    "stale_deliveries": ("onward_stale_deliveries",
                         "Step messages that found the run elsewhere (no-ops).", None),
    "runs_finished": ("onward_runs_finished", "Runs that stopped, by final status.", "status"),
}


def _wv(row: dict[str, Any]) -> list[str]:
    return [str(row["workflow"]), str(row["version"] if row["version"] is not None else 0)]


class LedgerCollector(Collector):
    def __init__(self, engine: Engine, *, worker_ttl_s: float = 30.0,
                 outbox_grace_s: float = 30.0) -> None:
        self.engine = engine
        self.worker_ttl_s = worker_ttl_s
        self.outbox_grace_s = outbox_grace_s

    def snapshot(self) -> Health:
        return read_health(self.engine, worker_ttl_s=self.worker_ttl_s,
                           outbox_grace_s=self.outbox_grace_s)

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        h = self.snapshot()
        yield from _counters(h)
        yield _histogram(h)
        yield from _runs(h)
        yield from _effects_outbox_approvals(h)
        yield from _fleet(h)
        yield GaugeMetricFamily("onward_scrape_duration_seconds",
                                "How long reading the ledger for this scrape took.",
                                value=time.perf_counter() - started)


def _counters(h: Health) -> Iterator[Metric]:
    families: dict[str, CounterMetricFamily] = {}
    for metric, (name, doc, label) in _COUNTERS.items():
        families[metric] = CounterMetricFamily(name, doc, labels=WV + ([label] if label else []))
    for row in h.totals:
        family = families.get(row["metric"])
        if family is not None:
            extra = [row["label"]] if _COUNTERS[row["metric"]][2] else []
            family.add_metric(_wv(row) + extra, row["value"])
    yield from families.values()
    restores = CounterMetricFamily("onward_restores",
                                   "Steps taken over after their worker was lost.", labels=WV)
    for row in h.restores:
        restores.add_metric(_wv(row), row["n"])
    yield restores


def _histogram(h: Health) -> HistogramMetricFamily:
    per: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for row in h.totals:
        if row["metric"].startswith("step_seconds"):
            per[tuple(_wv(row))][f"{row['metric']}:{row['label']}"] = row["value"]  # type: ignore[index]
    family = HistogramMetricFamily("onward_step_duration_seconds",
                                   "Committed step duration, claim to commit, by worker.",
                                   labels=WV)
    for key, values in sorted(per.items()):
        cumulative, buckets = 0.0, []
        for bound in BUCKETS:
            cumulative += values.get(f"step_seconds_bucket:{bound}", 0.0)
            buckets.append((str(bound), cumulative))
        buckets.append(("+Inf", values.get("step_seconds_count:", cumulative)))
        family.add_metric(list(key), buckets, sum_value=values.get("step_seconds_sum:", 0.0))
    return family


def _runs(h: Health) -> Iterator[Metric]:
    runs = GaugeMetricFamily("onward_runs", "Runs not finished, by status.",
                             labels=[*WV, "status"])
    parked = GaugeMetricFamily("onward_parked_runs", "Runs parked for review, by reason.",
                               labels=[*WV, "reason"])
    waiting = GaugeMetricFamily("onward_waiting_runs",
                                "Runs waiting (approval, signal, effect, timer), by kind.",
                                labels=[*WV, "kind"])
    totals: dict[tuple[str, ...], float] = defaultdict(float)
    for row in h.active_runs:
        totals[(*_wv(row), row["status"])] += row["n"]
        if row["status"] == RunStatus.NEEDS_REVIEW:
            parked.add_metric([*_wv(row), row["why"]], row["n"])
        elif row["status"] == RunStatus.WAITING:
            waiting.add_metric([*_wv(row), row["why"]], row["n"])
    for key, n in sorted(totals.items()):
        runs.add_metric(list(key), n)
    yield from (runs, parked, waiting)


def _effects_outbox_approvals(h: Health) -> Iterator[Metric]:
    unresolved = GaugeMetricFamily("onward_unresolved_effects",
                                   "Effects pending or accepted at the provider.",
                                   labels=[*WV, "status"])
    age = GaugeMetricFamily("onward_oldest_unresolved_effect_age_seconds",
                            "Age of the oldest pending or accepted effect.",
                            labels=[*WV, "status"])
    for row in h.effects:
        unresolved.add_metric([*_wv(row), row["status"]], row["n"])
        age.add_metric([*_wv(row), row["status"]], row["oldest_s"])
    yield from (unresolved, age)
    due = GaugeMetricFamily("onward_outbox_due", "Outbox rows due and not yet consumed.",
                            labels=WV)
    lag = GaugeMetricFamily("onward_outbox_lag_seconds",
                            "How long the oldest due row has waited for a publish.", labels=WV)
    for row in h.outbox:
        due.add_metric(_wv(row), row["due"])
        lag.add_metric(_wv(row), row["lag_s"])
    yield from (due, lag)
    pending = GaugeMetricFamily("onward_pending_approvals",
                                "Runs waiting for a person's approval.", labels=WV)
    for row in h.active_runs:
        if row["status"] == RunStatus.WAITING and row["why"] == WaitKind.APPROVAL:
            pending.add_metric(_wv(row), row["n"])
    yield pending
    yield GaugeMetricFamily("onward_oldest_pending_approval_age_seconds",
                            "Age of the oldest pending approval (all workflows).",
                            value=h.oldest_approval_s)
    yield GaugeMetricFamily("onward_approvals_pending_total",
                            "Pending approvals (all workflows).", value=h.approvals_pending)


def _fleet(h: Health) -> Iterator[Metric]:
    yield GaugeMetricFamily("onward_workers_live", "Workers that advertised within the TTL.",
                            value=h.workers_live)
    yield GaugeMetricFamily("onward_steps_in_flight",
                            "Step messages live workers are executing.", value=h.steps_in_flight)
    unserved = GaugeMetricFamily("onward_unserved_runs",
                                 "Active runs of a workflow (version) no live worker has.",
                                 labels=WV)
    for row in h.unserved:
        unserved.add_metric(_wv(row), row["runs"])
    yield unserved
    in_use = GaugeMetricFamily("onward_quota_slots_in_use", "Quota slots in use.",
                               labels=["quota"])
    limit = GaugeMetricFamily("onward_quota_slots_limit", "Quota slots allowed.",
                              labels=["quota"])
    for quota in h.quotas:
        in_use.add_metric([quota.quota], quota.in_use)
        if quota.limit is not None:
            limit.add_metric([quota.quota], quota.limit)
    yield from (in_use, limit)
    yield from _limits(h)


def _limits(h: Health) -> Iterator[Metric]:
    """Fleet-wide limits (docs/limits.md): use against what was declared, and who waits."""
    labels = ["limit"]
    waiting = GaugeMetricFamily("onward_limit_waiting_runs",
                                "Runs waiting (without a worker) for a slot of the limit.",
                                labels=labels)
    started = GaugeMetricFamily("onward_limit_rate_started",
                                "Calls started within the limit's rate window.", labels=labels)
    rate = GaugeMetricFamily("onward_limit_rate_allowed",
                             "Calls the limit allows to start per rate window.", labels=labels)
    granted = CounterMetricFamily("onward_limit_granted", "Calls the limit let through.",
                                  labels=labels)
    throttled = CounterMetricFamily("onward_limit_throttled",
                                    "Times a call found the limit full and its step waited.",
                                    labels=labels)
    for state in h.limits:
        waiting.add_metric([state.key], state.waiting)
        granted.add_metric([state.key], state.granted)
        throttled.add_metric([state.key], state.throttled)
        if state.rate_count is not None:
            started.add_metric([state.key], state.started_in_window)
            rate.add_metric([state.key], state.rate_count)
    yield from (waiting, started, rate, granted, throttled)


def serve_metrics(engine: Engine, port: int, host: str = "127.0.0.1", *,
                  worker_ttl_s: float = 30.0, outbox_grace_s: float = 30.0) -> threading.Event:
    """Register the collector and serve /metrics until the returned event is set."""
    REGISTRY.register(LedgerCollector(engine, worker_ttl_s=worker_ttl_s,
                                      outbox_grace_s=outbox_grace_s))
    start_http_server(port, addr=host)
    return threading.Event()
