"""Which Celery execution pool ``onward worker`` runs, and the Celery options it passes on.

- ``prefork`` (default): one process per concurrent step. CPU-bound steps, steps calling C
  libraries that hold the GIL, and code that is not thread-safe. A host holds as many steps
  in flight as it has processes (memory-bound: ~60-80 MB each).
- ``threads``: ``-c N`` threads in one process. Steps that wait on models and tools
  (seconds of I/O per step): tens to a few hundred in flight per process.
- ``gevent``: ``-c N`` greenlets in one process, the standard library monkey-patched at
  startup (``console/__init__.py``) so sockets, ``time.sleep`` and psycopg's waits yield.
  Hundreds to thousands of model calls in flight per host, if every library the steps use
  does its I/O through patched sockets (httpx, requests, openai and anthropic do).
- ``solo``: one step at a time in the main process (debugging).

docs/operating.md ("Choosing a worker pool") has the measured figures behind this advice.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from ledger.exceptions import InvalidInput

if TYPE_CHECKING:
    from tasks.workflow import Registry

__all__ = ["PoolKind", "PoolOptions", "check_pool_runs"]


class PoolKind(StrEnum):
    PREFORK = "prefork"
    THREADS = "threads"
    GEVENT = "gevent"
    SOLO = "solo"

    @property
    def in_process(self) -> bool:
        """True when all the worker's steps share one process (and its ledger pool)."""
        return self is not PoolKind.PREFORK


@dataclass(frozen=True)
class PoolOptions:
    """``onward worker``'s pool and the Celery worker options passed through unchanged."""

    pool: PoolKind = PoolKind.PREFORK
    concurrency: int = 2
    autoscale: str | None = None  # "MAX,MIN" (prefork only)
    max_tasks_per_child: int | None = None  # prefork only
    max_memory_per_child: int | None = None  # KiB, prefork only
    prefetch_multiplier: int | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise InvalidInput(f"-c/--concurrency must be at least 1, got {self.concurrency}")
        if self.prefetch_multiplier is not None and self.prefetch_multiplier < 1:
            raise InvalidInput("--prefetch-multiplier must be at least 1")
        prefork_only = {"--autoscale": self.autoscale,
                        "--max-tasks-per-child": self.max_tasks_per_child,
                        "--max-memory-per-child": self.max_memory_per_child}
        given = [flag for flag, value in prefork_only.items() if value is not None]
        if given and self.pool is not PoolKind.PREFORK:
            raise InvalidInput(
                f"{', '.join(given)} only apply to the prefork pool (Celery recycles and "
                f"scales child processes; the {self.pool} pool has none): drop them or use "
                "--pool prefork")
        if self.autoscale is not None:
            self.autoscale_bounds()  # validates

    def autoscale_bounds(self) -> tuple[int, int]:
        parts = (self.autoscale or "").split(",")
        try:
            high, low = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
        except ValueError:
            raise InvalidInput(f"--autoscale takes MAX,MIN (e.g. 10,3), got {self.autoscale!r}"
                               ) from None
        if high < 1 or low < 0 or low > high or len(parts) > 2:
            raise InvalidInput(f"--autoscale takes MAX,MIN with MAX >= MIN >= 0, got "
                               f"{self.autoscale!r}")
        return high, low

    @property
    def steps_per_process(self) -> int:
        """Steps one process runs at once: what its ledger connection pool is sized to."""
        return self.concurrency if self.pool.in_process else 1

    def celery_args(self) -> list[str]:
        """The options for ``celery worker`` (after ``worker``)."""
        args = ["-P", self.pool.value, "-c", str(self.concurrency)]
        if self.autoscale is not None:
            args += ["--autoscale", self.autoscale]
        if self.max_tasks_per_child is not None:
            args += ["--max-tasks-per-child", str(self.max_tasks_per_child)]
        if self.max_memory_per_child is not None:
            args += ["--max-memory-per-child", str(self.max_memory_per_child)]
        if self.prefetch_multiplier is not None:
            args += ["--prefetch-multiplier", str(self.prefetch_multiplier)]
        return args


def check_pool_runs(pool: PoolKind, registry: Registry) -> None:
    """Refuse, when the worker starts, workflows this pool cannot run: ``async def`` steps,
    async tools and async model clients need an event loop of their own (tasks/aio.py),
    which gevent's patched threads and sockets cannot host. Never found out at run time."""
    if pool is not PoolKind.GEVENT:
        return
    found = registry.async_parts()
    if not found:
        return
    named = "; ".join(f"{workflow}: {', '.join(parts)}" for workflow, parts in found.items())
    raise InvalidInput(
        f"the gevent pool cannot run async steps, tools or model clients ({named}): start "
        "these workflows' workers with --pool threads (many steps in flight per process) or "
        "--pool prefork, or keep them out of this worker's ONWARD_WORKFLOWS "
        "(docs/steps.md, \"Async steps\")")
