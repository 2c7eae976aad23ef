"""Executes steps in the test process, one message at a time, against the real ledger.

No broker and no worker process: ``drive`` calls ``tasks.executor.execute_step`` for the
run's current seq until the run stops running. Operator-command tests use it to check what
each mode of a replay calls, step by step, in seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from uuid import UUID

import pytest

from ledger import Ledger, RunStatus
from ledger.runs import Run
from ledger.steps import StepStore
from tasks.executor import ExecutorConfig, StepMessage, StepReport, execute_step
from tasks.workflow import Registry
from workers.settings import WorkerSettings

__all__ = ["Driver", "driver", "driver_fixture"]


@dataclass
class Driver:
    ledger: Ledger
    store: StepStore
    registry: Registry
    config: ExecutorConfig

    def step(self, run_id: UUID, seq: int) -> StepReport:
        return execute_step(self.store, self.registry, self.config,
                            StepMessage(run_id=run_id, seq=seq), worker="driver:0",
                            publish=lambda *args: None)

    def drive(self, run_id: UUID, *, max_steps: int = 30) -> Run:
        """Execute steps until the run is no longer runnable; return it."""
        for _ in range(max_steps):
            run = self.ledger.get_run(run_id)
            if run is None:
                raise AssertionError(f"no run {run_id}")
            if run.status is not RunStatus.RUNNING:
                return run
            self.step(run_id, run.seq)
        raise AssertionError(f"run {run_id} still running after {max_steps} steps: "
                             f"{self.ledger.get_run(run_id)}")


@contextmanager
def driver(ledger: Ledger, modules: list[str], *, worker_url: str | None = None,
           state_inline_bytes: int = 64 * 1024,
           snapshot_every: int | None = None) -> Iterator[Driver]:
    """Steps executed as a worker connected to ``worker_url`` (the ledger's by default);
    states over ``state_inline_bytes`` are stored apart, as artifacts."""
    registry = Registry()
    registry.load_modules(modules)
    store = StepStore(worker_url or ledger.url, ledger.keys, lease_ttl_s=30,
                      state_inline_bytes=state_inline_bytes,
                      snapshot_every=snapshot_every
                      or WorkerSettings.of(ledger.settings).checkpoint_snapshot_every)
    settings = ledger.settings
    config = ExecutorConfig(keys=ledger.keys, max_state_bytes=settings.max_state_bytes,
                            retry_base_s=0.0, retry_max_s=0.0,
                            max_artifact_bytes=settings.max_artifact_bytes,
                            max_json_depth=settings.max_json_depth,
                            max_effect_payload_bytes=settings.max_effect_payload_bytes,
                            max_approval_artifact_bytes=settings.max_approval_artifact_bytes)
    try:
        yield Driver(ledger, store, registry, config)
    finally:
        store.close()


def driver_fixture(modules: Sequence[str], *, ledger: str = "ledger"
                   ) -> Callable[..., Iterator[Driver]]:
    """The test module's ``drv`` fixture: a ``driver`` over the ledger fixture named
    ``ledger`` (``ledger``, ``ops``, ``admin``...), loading ``modules``. A module writes
    ``drv = driver_fixture(MODULES)``, not its own copy of the five lines."""
    @pytest.fixture()
    def drv(request: pytest.FixtureRequest) -> Iterator[Driver]:
        with driver(request.getfixturevalue(ledger), list(modules)) as running:
            yield running

    return drv
