"""The model-based test's clock (tests/model/harness.py ``Clock``): no real second reaches
the code under test. ``onward.now()`` on every kind of connection the test drives, a step's
``ctx.now()`` and a lease's countdown stand still while real time passes and move by exactly
what the model advances. A real second that reached a timer, a lease or the outbox's
republish delay made a slow example (a busy machine) replay otherwise than it first ran, and
hypothesis failed the soak with ``FlakyStrategyDefinition`` (a precondition or a bundle came
out otherwise)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import pytest

import ledger.steps
import tasks.executor
import tasks.scope
from ledger import Ledger
from tasks.executor import ExecutorConfig
from tasks.workflow import Registry
from tests.model import flows
from tests.model.harness import EPOCH, Broker, Clock, Crashes, Worker
from workers.settings import WorkerSettings

__all__: list[str] = []

pytestmark = pytest.mark.model


def _real_time_passes() -> None:
    """Let the host's clocks move by a millisecond (what is measured is that nothing follows
    them: there is no condition to wait for)."""
    started = time.monotonic()
    while time.monotonic() - started < 0.001:
        time.sleep(0.001)


def test_clock__only_the_model_moves_time(settings: WorkerSettings,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ledger_ = Ledger.from_env(settings)
    clock = Clock()
    clock.freeze(ledger_.engine)
    clock.follow(ledger_.engine)
    clock.install(monkeypatch)
    registry = Registry()
    registry.register(flows.flow_v1)
    config = ExecutorConfig(keys=ledger_.keys, max_state_bytes=settings.max_state_bytes,
                            retry_base_s=1.0, retry_max_s=10.0)
    worker = Worker(0, ledger_.url, ledger_.keys, config, registry, Broker(), Crashes(), clock)
    checker = clock.connect_raw(ledger_.url)
    claimed = tasks.executor.StepClock(EPOCH)  # what the executor makes for a claim

    def now_everywhere() -> dict[str, Any]:
        with ledger_.engine.connect() as conn:
            engine_now = conn.exec_driver_sql("SELECT onward.now()").scalar_one()
        hot = worker.store.conn.one("SELECT onward.now() AS now", {})
        assert hot is not None
        return {"engine": engine_now, "raw": checker.execute("SELECT onward.now()").fetchone()[0],
                "worker": hot["now"], "step": claimed.now(),
                "lease_clock": ledger.steps.lease_clock(), "scope": tasks.scope.lease_clock()}

    try:
        first = now_everywhere()
        _real_time_passes()
        assert now_everywhere() == first
        assert {first[k] for k in ("engine", "raw", "worker", "step")} == {EPOCH}

        clock.advance(31)
        moved = now_everywhere()
        later: datetime = EPOCH + timedelta(seconds=31)
        assert moved == {"engine": later, "raw": later, "worker": later, "step": later,
                         "lease_clock": first["lease_clock"] + 31,
                         "scope": first["scope"] + 31}
    finally:
        worker.store.close()
        checker.close()
        ledger_.engine.dispose()
