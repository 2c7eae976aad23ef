"""The seeded schedule: waves of runs and chaos events, in seconds from the start of chaos."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bench.chaos.config import Config

WORKER_POINTS = [
    "after_effect_pending",
    "after_provider_response",
    "after_effect_recorded",
    "before_checkpoint_commit",
    "after_commit_before_publish",
    "after_chained_commit",
]
DISPATCHER_POINT = "dispatcher_after_publish_before_mark"


@dataclass(order=True)
class Item:
    at: float
    order: int
    kind: str = field(compare=False)
    arg: Any = field(compare=False, default=None)
    retries: int = field(compare=False, default=0)


def make_plan(cfg: Config, rng: random.Random) -> list[Item]:
    """Seeded schedule of run waves and chaos events, in seconds from the start of chaos."""
    order = itertools.count()
    items = [*run_waves(cfg, order), *process_kills(cfg, rng, order),
             *outages(cfg, rng, order), *heavier_items(cfg, rng, order)]
    items.sort()
    return items


def run_waves(cfg: Config, order: Iterator[int]) -> list[Item]:
    """Up to 10 waves of runs, spread over the first 70% of the window."""
    items = []
    waves = max(1, min(cfg.runs, 10))
    per_wave = [cfg.runs // waves + (1 if i < cfg.runs % waves else 0) for i in range(waves)]
    first = 0
    for i, count in enumerate(per_wave):
        wave_at = cfg.window_s * 0.7 * i / (waves - 1) if waves > 1 else 0.0
        items.append(Item(wave_at, next(order), "start_runs", (first, count)))
        first += count
    return items


def process_kills(cfg: Config, rng: random.Random, order: Iterator[int]) -> list[Item]:
    """Pool children, whole workers (restarted with named points armed), paused lease
    holders, dispatchers (the first restarted with its named point armed)."""
    items = [Item(_anytime(cfg, rng), next(order), "kill_child")
             for _ in range(cfg.child_kills)]
    items += tree_kills(cfg, rng, order)
    items += [Item(_anytime(cfg, rng), next(order), "pause_holder")
              for _ in range(cfg.pauses)]
    items += [Item(_anytime(cfg, rng), next(order), "kill_dispatcher",
                   DISPATCHER_POINT if i == 0 else "") for i in range(cfg.dispatcher_kills)]
    return items


def tree_kills(cfg: Config, rng: random.Random, order: Iterator[int]) -> list[Item]:
    """The named points are armed on the workers restarted after whole-tree kills, spread
    round-robin over the restarts (several "once" points in one worker fire one by one:
    each kills a pool child, which the worker replaces)."""
    points = [f"{point}:kill:once" for point in WORKER_POINTS]
    rng.shuffle(points)
    if cfg.stop_point:
        points.insert(rng.randrange(len(points) + 1), "after_effect_pending:stop:once")
    groups: list[list[str]] = [[] for _ in range(cfg.tree_kills)]
    for i, spec in enumerate(points if cfg.tree_kills else []):
        groups[i % cfg.tree_kills].append(spec)
    times = sorted(rng.uniform(cfg.window_s * 0.05, cfg.window_s * 0.6)
                   for _ in range(cfg.tree_kills))
    return [Item(t, next(order), "kill_tree", (",".join(group), 0))
            for t, group in zip(times, groups, strict=True)]


def outages(cfg: Config, rng: random.Random, order: Iterator[int]) -> list[Item]:
    """A broker flush, provider drops and 500s, a period of asynchronous completion."""
    items = []
    if cfg.flush:
        items.append(Item(rng.uniform(cfg.window_s * 0.3, cfg.window_s * 0.7), next(order),
                          "flush_broker"))
    items += [Item(_anytime(cfg, rng), next(order), "provider_drop", rng.randint(1, 3))
              for _ in range(cfg.drop_waves)]
    items += [Item(_anytime(cfg, rng), next(order), "provider_500", rng.randint(1, 3))
              for _ in range(cfg.error_waves)]
    if cfg.async_period:
        start = rng.uniform(cfg.window_s * 0.2, cfg.window_s * 0.5)
        items.append(Item(start, next(order), "provider_async", 0.4))
        items.append(Item(start + cfg.window_s * 0.2, next(order), "provider_async", 0.0))
    return items


def heavier_items(cfg: Config, rng: random.Random, order: Iterator[int]) -> list[Item]:
    """PostgreSQL restarts, backend terminations and calls longer than the lease."""
    items = [Item(rng.uniform(cfg.window_s * 0.2, cfg.window_s * 0.7), next(order),
                  "restart_postgres") for _ in range(cfg.pg_restarts)]
    items += [Item(_anytime(cfg, rng), next(order), "kill_backend", ("worker", "dispatcher")[i % 2])
              for i in range(cfg.backend_kills)]
    items += [Item(_anytime(cfg, rng), next(order), "provider_slow", 1)
              for _ in range(cfg.long_calls)]
    return items


def _anytime(cfg: Config, rng: random.Random) -> float:
    return rng.uniform(cfg.window_s * 0.05, cfg.window_s * 0.85)
