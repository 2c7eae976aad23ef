"""What the chaos actions share: the configuration, the seeded randomness, the clock and the
schedule, the servers, the fleet, the runs started and the tallies of what was done."""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

from bench.chaos.config import Config
from bench.chaos.fleet import Fleet
from bench.chaos.plan import Item
from bench.chaos.servers import Servers


@dataclass
class Stopped:
    """A SIGSTOPped lease holder: continued once another worker committed its step (or
    ``max_at`` passed), so that it resumes as a stale holder."""

    pid: int
    max_at: float
    run_id: UUID | None
    seq: int | None
    taken_over_at: float | None = None


@dataclass
class Starting:
    """A server start running in a thread, and how it ended."""

    thread: threading.Thread
    error: BaseException | None = None

    def run(self, start: Callable[[], None]) -> None:
        try:
            start()
        except BaseException as exc:  # reported by outages.poll_postgres
            self.error = exc


@dataclass
class Tally:
    """What the chaos did, for the report."""

    kills: Counter[str] = field(default_factory=Counter)
    kills_detail: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    unexpected_exits: list[str] = field(default_factory=list)
    exits_while_db_down: list[str] = field(default_factory=list)


class Chaos:
    """The state of one chaos run; the actions (kills, outages, runs) take it first."""

    fleet: Fleet

    def __init__(self, cfg: Config, workdir: Path) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.workdir = workdir
        self.servers = Servers(cfg, workdir)
        self.tally = Tally()
        self.run_ids: list[UUID] = []
        self.blind: dict[UUID, int] = {}  # run -> the step that writes blind
        self.blind_plan: dict[int, int] = {}  # run index -> the step that writes blind
        self.heap: list[Item] = []
        self.order = itertools.count(10_000)
        self.t0 = 0.0
        self.expected_dead: set[int] = set()
        self.killed_pids: set[int] = set()
        self.stopped: dict[int, Stopped] = {}  # SIGSTOPped pool children
        self.stop_markers_seen: set[Path] = set()
        self.db_down: tuple[float, float | None] | None = None  # (stopped at, started at)
        self.pg_starting: Starting | None = None

    def now(self) -> float:
        """Seconds since the chaos began."""
        return time.monotonic() - self.t0

    def schedule(self, delay: float, kind: str, arg: Any = None, retries: int = 0) -> None:
        heapq.heappush(self.heap, Item(self.now() + delay, next(self.order), kind, arg, retries))

    def db_is_down(self, grace_s: float = 10.0) -> bool:
        """Whether PostgreSQL is down, or came back less than ``grace_s`` ago."""
        if self.db_down is None:
            return False
        _stopped, started = self.db_down
        return started is None or self.now() < started + grace_s
