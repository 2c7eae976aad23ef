"""Real onward processes for tests: celery workers, dispatchers, reapers, as subprocesses
(harness/processes.py; the same harness the benchmarks and the demo use).

Nothing here fakes a part of onward: each process is the same ``onward`` command an
operator runs, against a real PostgreSQL and a real broker (Redis, or RabbitMQ).
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from harness.processes import ROOT, Proc, Processes
from harness.waiting import wait_for
from ledger import Ledger, RunStatus
from tests.support.provider import Provider

__all__ = ["ROOT", "Cluster", "Proc", "start_fleet", "stopped", "wait_for"]


@dataclass
class Cluster(Processes):
    """Starts onward processes with one environment (database, broker, queue, home)."""

    def worker(self, *, concurrency: int = 2, env: dict[str, str] | None = None,
               name: str = "worker", wait_ready: bool = True, pool: str = "prefork") -> Proc:
        """``onward worker -P pool -c concurrency``: prefork children run the steps, or (threads,
        gevent) the worker process itself does."""
        # a node name of this test's own (its queue's tag): on RabbitMQ a node's remote-control
        # queue is exclusive, so two tests' workers may not share a name
        tag = self.env.get("ONWARD_QUEUE", "").rsplit(".", 1)[-1]
        proc = super().worker(name, concurrency=concurrency,
                              node=f"{name}-{self.started}-{tag}@test", env=env, pool=pool)
        if wait_ready:
            wait_for(lambda: proc.ready() or not proc.alive(), timeout=60,
                     what=f"{name} to be ready")
            if not proc.alive():
                raise AssertionError(f"{name} exited:\n{proc.tail()}")
        return proc

    def command(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        """Any other ``onward`` command, e.g. ``["metrics", "--port", "9464"]``."""
        return self.onward(name, args, env)

    def dispatcher(self, env: dict[str, str] | None = None) -> Proc:
        return self.onward("dispatcher", ["dispatcher"], env)

    def reaper(self, env: dict[str, str] | None = None) -> Proc:
        return self.onward("reaper", ["reaper"], env)

    def stop_all(self, timeout: float = 15.0) -> None:
        super().stop_all(timeout)
        self.procs.clear()


def start_fleet(cluster: Cluster, provider: Provider, **env: str) -> None:
    """A dispatcher, a reaper and a worker of two processes, each with ``env`` (the
    workflow modules as ``ONWARD_WORKFLOWS``) and the provider's URL."""
    shared = {"ONWARD_EXAMPLE_PROVIDER_URL": provider.url, **env}
    cluster.dispatcher(env=shared)
    cluster.reaper(env=shared)
    cluster.worker(concurrency=2, env=shared)


def stopped(ledger: Ledger, run_id: UUID, timeout: float = 90) -> RunStatus:
    """The run's status once it is no longer ``running``; after ``timeout`` seconds, a
    failure showing the run as last read."""
    def status() -> RunStatus | None:
        run = ledger.get_run(run_id)
        return run.status if run and run.status is not RunStatus.RUNNING else None

    return wait_for(status, timeout=timeout, what=f"run {run_id} to stop running",
                    seen=lambda: ledger.get_run(run_id))
