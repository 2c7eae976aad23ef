"""Per-process step counters, added to the ledger's ``metric_totals`` every few seconds.

Counting in the commit statement would make every worker update the same row per workflow
version on every step (a hot row: commits queue behind its lock); counting here costs a
dict update per step and one statement per process every ``FLUSH_S``. A worker process
killed with SIGKILL loses at most its last ``FLUSH_S`` of counts (what Prometheus's own
process counters would lose too); a clean stop flushes.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

import structlog

from ledger.exceptions import LedgerUnavailable
from ledger.health import TotalKey, add_totals
from ledger.hot import HotConnection
from ledger.vocabulary import RunStatus
from tasks.executor import ReportKind, StepReport

__all__ = ["BUCKETS", "FLUSH_S", "StepMeter"]


log = structlog.get_logger("onward.worker")

FLUSH_S = 5.0
# Step duration buckets, seconds (claim to commit as the worker sees it).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_TERMINAL = {status.value for status in RunStatus if status.terminal}


class StepMeter:
    """Counts what the steps of this process did; a daemon thread flushes the counts."""

    def __init__(self, url: str, flush_s: float = FLUSH_S) -> None:
        self._url = url
        self._flush_s = flush_s
        self._lock = threading.Lock()
        self._deltas: dict[TotalKey, float] = defaultdict(float)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def observe(self, report: StepReport, seconds: float) -> None:
        """Count one step execution (called after ``execute_step`` returns)."""
        key = (report.workflow or "", report.version or 0)
        with self._lock:
            deltas = self._deltas
            if report.kind is ReportKind.STALE:
                deltas[(*key, "stale_deliveries", "")] += 1
                return
            deltas[(*key, "step_outcomes", report.kind.value)] += 1
            if report.kind is ReportKind.COMMITTED:
                deltas[(*key, "steps_committed", "")] += 1
                index = bisect.bisect_left(BUCKETS, seconds)
                if index < len(BUCKETS):
                    deltas[(*key, "step_seconds_bucket", str(BUCKETS[index]))] += 1
                deltas[(*key, "step_seconds_count", "")] += 1
                deltas[(*key, "step_seconds_sum", "")] += seconds
            finished = (report.status if report.status in _TERMINAL else
                        RunStatus.FAILED.value if report.kind is ReportKind.FAILED else None)
            if finished:
                deltas[(*key, "runs_finished", finished)] += 1
        self._start()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="onward-meter", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._flush_s):
            self.flush()

    def flush(self) -> None:
        """Add what was counted since the last flush to the ledger (kept on failure)."""
        with self._lock:
            deltas, self._deltas = self._deltas, defaultdict(float)
        if not deltas:
            return
        conn = HotConnection(self._url)
        try:
            add_totals(conn, deltas)
        except LedgerUnavailable as exc:
            log.warning("could not flush step counters; keeping them", error=str(exc))
            with self._lock:
                for key, value in deltas.items():
                    self._deltas[key] += value
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.flush()
