#!/usr/bin/env python
"""Chaos benchmark: R runs x K irreversible effects while processes are SIGKILLed, the
broker is flushed and the provider misbehaves; then the ledger and the provider are counted
independently (docs/design.md sections 4, 5 and 7; docs/guarantees.md).

    .venv/bin/python bench/chaos.py                      # defaults: 40 runs x 5 steps, seed 1
    .venv/bin/python bench/chaos.py --seed 7 --runs 60 --steps 4
    .venv/bin/python bench/chaos.py --runs 1000          # window, settle and chaos scale up
    .venv/bin/python bench/chaos.py --json               # quieter stderr; JSON on stdout

What it sets up (nothing shared with other users of the servers is touched):

* its own PostgreSQL server whenever it restarts PostgreSQL (``--pg-restarts``, 1 or more by
  default): a throwaway cluster initdb'd in a temporary directory with the binaries the
  ``pgserver`` package ships, on a free loopback port (harness/postgres.py), removed at the
  end. A server somebody else uses is never restarted. With ``--pg-restarts 0`` it uses the
  configured server (embedded by default, or the server of ONWARD_DATABASE_URL);
* its own database on that server, migrated with ``ledger.migrate.upgrade``; dropped at the
  end when the pass bar holds, kept (name printed) when it does not;
* its own queue name, on its own Redis database number of the configured broker (the first
  empty one of 1..14 unless ``--broker-db``), because it FLUSHDBs that database once;
* the reference provider (examples/provider.py, a real HTTP service with its own store),
  with a short key retention (``key_ttl_s``) so that a blind resend would create a duplicate;
* real ``onward`` processes: 2 workers (``-c 2``), 2 dispatchers, 1 reaper, with a 3 s lease
  and fast reaper/dispatcher timings.

The workload (bench/chaos_agent.py): R runs started in waves during the chaos window; each
step makes one irreversible write through a tool with a lookup by key. ``--blind-runs`` runs
make one of their writes through a tool with no lookup and no provider dedupe, and the
provider drops exactly those responses: those runs must park (``effect_outcome_unknown``)
and are the expected parks.

Chaos, at seeded random moments (``--seed``):

* SIGKILL of the prefork child that holds a lease (``onward.runs.lease_owner`` "host:pid");
* SIGKILL of a whole worker process tree (``--tree-kills``, 3 by default), restarted with
  named fault points armed, spread over the restarts (after_effect_pending,
  after_provider_response, after_effect_recorded, before_checkpoint_commit,
  after_commit_before_publish, each ``kill:once``: the pool child dies there once and the
  worker replaces it);
* SIGKILL of a dispatcher, restarted (once with dispatcher_after_publish_before_mark armed);
* FLUSHDB of the broker's Redis database, once;
* PostgreSQL stopped mid-batch (``pg_ctl stop -m immediate``: a crash, recovered from the
  WAL) and started again after 0.5-3 s (``--pg-restarts``);
* ``pg_terminate_backend`` of one database connection of a worker (pool children and
  master) or of a dispatcher, alternately (``--backend-kills``; each process's connections
  carry ``application_name`` chaos-<role><slot>.g<gen> through PGAPPNAME);
* effect calls longer than the lease: the provider holds the next few creates
  ``--long-call-s`` seconds (the lease TTL + 1 s by default) before acting
  (``--long-calls``);
* provider faults: dropped responses and HTTP 500s on the lookup tool's collection, and a
  period of asynchronous completion (202 + status polling);

The counts of each kind of chaos are given per minute of chaos window (``--window``, by
default 60 s or 0.1 s per step of work, whichever is longer), so ``--runs 1000`` gets
proportionally more of each (whole-worker, dispatcher and PostgreSQL restarts, which cost
seconds of CPU each, up to a bound); a count given on the command line is used as is.
Above 1,000 steps of work each worker runs 4 pool children instead of 2 (``--concurrency``).
* opt-in, a stale lease holder: ``--pauses N`` SIGSTOPs lease holders, ``--stop-point``
  arms ``after_effect_pending:stop:once`` (the child stops itself after recording the intent,
  before calling); each is SIGCONTed once another worker has taken the step over and
  committed it (design scenario 16, "lease holder paused past TTL, then resumes").

When every run is terminal or parked (or the deadline passes) it counts, from the ledger and
from the provider separately, and prints progress to stderr and ONE JSON line to stdout:

* ``lost_runs``: runs neither completed nor parked as expected;
* ``duplicate_provider_objects``: provider objects sharing an idempotency key beyond the
  first (provider's /admin/stats); ``duplicate_objects_by_payload``: objects for the same
  (run, step) beyond the first, from the objects' bodies (catches an unstable key);
* ``duplicate_commits``: (run, seq) committed twice (``ledger.batch_stats``);
* ``orphan_pending_effects``: effects still pending/accepted after settling, other than the
  one unknown write of each expected park;
* ``parked`` / ``expected_parked``;
* ``postgres_restarts``, ``backend_kills``, ``long_calls`` (creates the provider held past
  the lease): how much of the heavier chaos happened;
* cross-checks: every provider object's key is a completed effect in the ledger (or the
  unconfirmed write of an expected park) and every completed effect has its object, with
  the same provider id; every completed run's result lists the provider's ids;
  provider_objects == expected_provider_objects + provider_objects_unconfirmed.

Exit status: 0 when the pass bar holds (zero lost, duplicates, orphans and mismatches;
parked == expected_parked), 1 when it does not, 2 when the bench could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import itertools
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import psutil  # noqa: E402
import psycopg  # noqa: E402
import redis  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sqlalchemy.engine import Engine, make_url  # noqa: E402

from bench.chaos_agent import (  # noqa: E402
    BLIND_COLLECTION,
    COLLECTION,
    MAX_ATTEMPTS,
    WORKFLOW,
)
from harness.postgres import PrivatePostgres  # noqa: E402
from ledger import Ledger, OnwardSettings  # noqa: E402
from ledger.db import database_url  # noqa: E402
from ledger.exceptions import LedgerUnavailable  # noqa: E402
from ledger.migrate import upgrade  # noqa: E402
from workers.broker import broker_url  # noqa: E402

WORKER_POINTS = [
    "after_effect_pending",
    "after_provider_response",
    "after_effect_recorded",
    "before_checkpoint_commit",
    "after_commit_before_publish",
]
DISPATCHER_POINT = "dispatcher_after_publish_before_mark"
APP_PREFIX = "chaos-"  # application_name of the fleet's database connections
CHECKPOINT_KEY = "chaos-bench-checkpoint-key"
OWNER_KEY = "onward-chaos-bench:owner"  # marks the Redis DB as taken while the bench runs
OWNER_TOKEN = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

VERBOSE = True
DB_ERRORS = (sa.exc.DBAPIError, psycopg.Error, LedgerUnavailable)
T = TypeVar("T")


def log(message: str, *, always: bool = False) -> None:
    if VERBOSE or always:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- processes ------------------------------------------------------------------------------
@dataclass
class Proc:
    role: str  # worker | dispatcher | reaper | provider
    slot: int
    gen: int
    popen: subprocess.Popen[bytes]
    log_path: Path
    faults: str = ""
    fault_dir: Path | None = None
    ready_at: float | None = None  # time.monotonic() when "ready." appeared in its log
    killed_by_us: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def name(self) -> str:
        return f"{self.role}{self.slot}.g{self.gen}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def children(self) -> list[int]:
        """Live (not yet reaped, not zombie) descendants."""
        found = []
        try:
            for child in psutil.Process(self.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if child.status() != psutil.STATUS_ZOMBIE:
                        found.append(child.pid)
        except psutil.NoSuchProcess:
            pass
        return found

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill_tree(self) -> None:
        """SIGKILL the process and everything under it (its own session and group)."""
        self.killed_by_us = True
        pids = [*self.children(), self.pid]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> None:
        self.killed_by_us = True
        for pid in self.children():  # a SIGSTOPped child would block a warm shutdown
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
        # whatever is left of its group (pool children of a worker that died hard)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)


class Fleet:
    """Starts and tracks the onward processes of this bench."""

    def __init__(self, env: dict[str, str], log_dir: Path, faults_root: Path,
                 concurrency: int) -> None:
        self.env = env
        self.log_dir = log_dir
        self.faults_root = faults_root
        self.concurrency = concurrency
        self.counter = itertools.count()
        self.gens: Counter[str] = Counter()
        self.current: dict[tuple[str, int], Proc] = {}
        self.all: list[Proc] = []
        self.fault_dirs: list[tuple[str, str, Path]] = []  # (role, faults, dir)

    def _start(self, role: str, slot: int, args: list[str], faults: str) -> Proc:
        gen = self.gens[f"{role}{slot}"]
        self.gens[f"{role}{slot}"] += 1
        fault_dir = self.faults_root / f"{role}{slot}.g{gen}"
        fault_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, "ONWARD_FAULTS": faults,
               "ONWARD_FAULTS_DIR": str(fault_dir),
               "PGAPPNAME": f"{APP_PREFIX}{role}{slot}.g{gen}"}  # finds its connections
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        log_path = self.log_dir / f"{next(self.counter):03d}-{role}{slot}.g{gen}.log"
        handle = open(log_path, "wb")  # noqa: SIM115 - owned by the child for its lifetime
        try:
            popen = subprocess.Popen([sys.executable, "-m", "console", *args], cwd=ROOT,
                                     env=env, stdout=handle, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        finally:
            handle.close()
        proc = Proc(role, slot, gen, popen, log_path, faults=faults, fault_dir=fault_dir)
        self.current[(role, slot)] = proc
        self.all.append(proc)
        if faults:
            self.fault_dirs.append((role, faults, fault_dir))
        return proc

    def worker(self, slot: int, faults: str = "") -> Proc:
        node = f"chaos-w{slot}-g{self.gens[f'worker{slot}']}-{os.getpid()}@{socket.gethostname()}"
        return self._start("worker", slot, ["worker", "-c", str(self.concurrency),
                                            "--name", node], faults)

    def dispatcher(self, slot: int, faults: str = "") -> Proc:
        return self._start("dispatcher", slot, ["dispatcher"], faults)

    def reaper(self, slot: int = 0) -> Proc:
        return self._start("reaper", slot, ["reaper"], "")

    def live(self, role: str) -> list[Proc]:
        return [p for (r, _), p in sorted(self.current.items()) if r == role and p.alive()]

    def workers_ready(self, for_s: float = 0.0) -> list[Proc]:
        """Live workers whose pool is up (for at least ``for_s`` seconds)."""
        now = time.monotonic()
        for proc in self.live("worker"):
            if proc.ready_at is None and "ready." in proc.log_text():
                proc.ready_at = now
        return [p for p in self.live("worker")
                if p.ready_at is not None and now - p.ready_at >= for_s]

    @staticmethod
    def unfired(proc: Proc) -> str:
        """The fault specs armed in ``proc`` that have not fired yet."""
        specs = [f.strip() for f in proc.faults.split(",") if f.strip()]
        if not specs or proc.fault_dir is None:
            return ",".join(specs)
        fired = {m.name.split("@")[0] + "." + m.name.split(".")[-2]
                 for m in proc.fault_dir.glob("*.fired")}
        return ",".join(f for f in specs
                        if f"{f.split(':')[0].split('@')[0]}.{f.split(':')[1]}" not in fired)

    def fired_in(self, proc: Proc) -> bool:
        """Whether every fault armed in ``proc`` (if any) has fired."""
        return not self.unfired(proc)

    def fired(self) -> list[tuple[str, str]]:
        """(role, marker) for every named fault point that fired."""
        found = []
        for role, _faults, path in self.fault_dirs:
            for marker in sorted(path.glob("*.fired")):
                point = marker.name.split("@")[0]
                action = marker.name.split(".")[-2]
                found.append((role, point if action == "kill" else f"{point}:{action}"))
        return found

    def stop_markers(self) -> list[tuple[Path, int]]:
        """(marker, pid) of every ``stop`` fault that fired: that process is SIGSTOPped."""
        found = []
        for _role, _faults, path in self.fault_dirs:
            for marker in path.glob("*.stop.fired"):
                with contextlib.suppress(OSError, ValueError):
                    found.append((marker, int(marker.read_text().strip())))
        return found

    def stop_all(self) -> None:
        for proc in reversed(self.all):
            proc.stop()


class Provider:
    """The reference provider, a real HTTP service in its own process."""

    def __init__(self, workdir: Path) -> None:
        port_file = workdir / "provider.port"
        self.log_path = workdir / "provider.log"
        handle = open(self.log_path, "wb")  # noqa: SIM115
        try:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "examples.provider", "--port", "0", "--db",
                 str(workdir / "provider.db"), "--port-file", str(port_file)],
                cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            handle.close()
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the provider did not start: {self.log_path.read_text()}")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port_file.read_text().strip()}"
        self.http = httpx.Client(base_url=self.url, timeout=30.0)

    def stats(self) -> dict[str, Any]:
        return dict(self.http.get("/admin/stats").raise_for_status().json())

    def objects(self) -> list[dict[str, Any]]:
        return list(self.http.get("/admin/objects").raise_for_status().json())

    def configure(self, **values: Any) -> None:
        self.http.post("/admin/config", json=values).raise_for_status()

    def arm(self, collection: str, **faults: float) -> None:
        self.http.post("/admin/faults",
                       json={"collection": collection, **faults}).raise_for_status()

    def stop(self) -> None:
        self.http.close()
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)


# -- servers: database and broker -------------------------------------------------------
def create_database(admin_url: str, name: str) -> str:
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    engine = sa.create_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    return url


def drop_database(admin_url: str, name: str) -> None:
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                {"n": name})
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
    finally:
        admin.dispose()


def with_redis_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def is_stopped(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_STOPPED)
    except psutil.Error:
        return False


def choose_broker_db(base_url: str, requested: int | None) -> tuple[str, bool]:
    """The broker URL to use and whether the bench owns (and may clear) that Redis DB."""
    if requested is not None and requested < 0:
        return base_url, False
    if requested is not None:
        return with_redis_db(base_url, requested), False
    for db in range(1, 15):
        url = with_redis_db(base_url, db)
        client = redis.Redis.from_url(url)
        try:
            if client.dbsize() == 0:
                client.set(OWNER_KEY, OWNER_TOKEN, ex=3600)
                return url, True
        finally:
            client.close()
    raise RuntimeError("no empty Redis database in 1..14 for the bench; pass --broker-db")


# -- the plan -------------------------------------------------------------------------------
PER_MINUTE = {  # default counts of each kind of chaos per minute of chaos window
    "child_kills": 8, "tree_kills": 3, "dispatcher_kills": 2, "drop_waves": 5,
    "error_waves": 5, "pg_restarts": 0.5, "backend_kills": 6, "long_calls": 3,
}
# Restarting a whole worker, a dispatcher or PostgreSQL costs seconds of CPU on a small
# machine: by default a long window gets at most this many.
DEFAULT_AT_MOST = {"tree_kills": 10, "dispatcher_kills": 6, "pg_restarts": 4}
BIG_BATCH_STEPS = 1000  # above runs x steps = this, each worker runs 4 pool children, not 2
@dataclass
class Config:
    runs: int
    steps: int
    seed: int
    window_s: float
    settle_s: float
    pause_ms: int
    child_kills: int
    tree_kills: int
    dispatcher_kills: int
    dispatchers: int
    blind_runs: int
    drop_waves: int
    error_waves: int
    flush: bool
    async_period: bool
    key_ttl_s: float
    lease_ttl_s: float
    broker_db: int | None
    keep: bool
    pauses: int = 0
    stop_point: bool = False
    pg_restarts: int = 0
    backend_kills: int = 0
    long_calls: int = 0
    long_call_s: float = 4.0
    concurrency: int = 2


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
        except BaseException as exc:  # reported by poll_postgres
            self.error = exc


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
    items: list[Item] = []
    waves = max(1, min(cfg.runs, 10))
    per_wave = [cfg.runs // waves + (1 if i < cfg.runs % waves else 0) for i in range(waves)]
    first = 0
    for i, count in enumerate(per_wave):
        wave_at = cfg.window_s * 0.7 * i / (waves - 1) if waves > 1 else 0.0
        items.append(Item(wave_at, next(order), "start_runs", (first, count)))
        first += count

    def at() -> float:
        return rng.uniform(cfg.window_s * 0.05, cfg.window_s * 0.85)

    for _ in range(cfg.child_kills):
        items.append(Item(at(), next(order), "kill_child"))
    # The named points are armed on the workers restarted after whole-tree kills, spread
    # round-robin over the restarts (several "once" points in one worker fire one by one:
    # each kills a pool child, which the worker replaces).
    points = [f"{point}:kill:once" for point in WORKER_POINTS]
    rng.shuffle(points)
    if cfg.stop_point:
        points.insert(rng.randrange(len(points) + 1), "after_effect_pending:stop:once")
    groups: list[list[str]] = [[] for _ in range(cfg.tree_kills)]
    for i, spec in enumerate(points if cfg.tree_kills else []):
        groups[i % cfg.tree_kills].append(spec)
    tree_times = sorted(rng.uniform(cfg.window_s * 0.05, cfg.window_s * 0.6)
                        for _ in range(cfg.tree_kills))
    for t, group in zip(tree_times, groups, strict=True):
        items.append(Item(t, next(order), "kill_tree", (",".join(group), 0)))
    for _ in range(cfg.pauses):
        items.append(Item(at(), next(order), "pause_holder"))
    for i in range(cfg.dispatcher_kills):
        items.append(Item(at(), next(order), "kill_dispatcher",
                          DISPATCHER_POINT if i == 0 else ""))
    if cfg.flush:
        items.append(Item(rng.uniform(cfg.window_s * 0.3, cfg.window_s * 0.7), next(order),
                          "flush_broker"))
    for _ in range(cfg.drop_waves):
        items.append(Item(at(), next(order), "provider_drop", rng.randint(1, 3)))
    for _ in range(cfg.error_waves):
        items.append(Item(at(), next(order), "provider_500", rng.randint(1, 3)))
    if cfg.async_period:
        start = rng.uniform(cfg.window_s * 0.2, cfg.window_s * 0.5)
        items.append(Item(start, next(order), "provider_async", 0.4))
        items.append(Item(start + cfg.window_s * 0.2, next(order), "provider_async", 0.0))
    items.extend(heavier_items(cfg, rng, order))
    items.sort()
    return items


def heavier_items(cfg: Config, rng: random.Random, order: Iterator[int]) -> list[Item]:
    """PostgreSQL restarts, backend terminations and calls longer than the lease."""
    def at() -> float:
        return rng.uniform(cfg.window_s * 0.05, cfg.window_s * 0.85)

    items = [Item(rng.uniform(cfg.window_s * 0.2, cfg.window_s * 0.7), next(order),
                  "restart_postgres") for _ in range(cfg.pg_restarts)]
    items += [Item(at(), next(order), "kill_backend", ("worker", "dispatcher")[i % 2])
              for i in range(cfg.backend_kills)]
    items += [Item(at(), next(order), "provider_slow", 1) for _ in range(cfg.long_calls)]
    return items


# -- the bench ----------------------------------------------------------------------------
class Chaos:
    def __init__(self, cfg: Config, workdir: Path) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.workdir = workdir
        self.kills: Counter[str] = Counter()
        self.kills_detail: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self.run_ids: list[UUID] = []
        self.blind: dict[UUID, int] = {}
        self.heap: list[Item] = []
        self.order = itertools.count(10_000)
        self.expected_dead: set[int] = set()
        self.killed_pids: set[int] = set()
        self.stopped: dict[int, Stopped] = {}  # SIGSTOPped pool children
        self.stop_markers_seen: set[Path] = set()
        self.unexpected_exits: list[str] = []
        self.exits_while_db_down: list[str] = []
        self.pg: PrivatePostgres | None = None
        self.db_down: tuple[float, float | None] | None = None  # (stopped at, started at)
        self.pg_starting: Starting | None = None
        self.fleet: Fleet
        self.provider: Provider
        self.engine: Engine
        self.ledger: Ledger
        self.broker: str
        self.t0 = 0.0

    # -- set-up -----------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        admin_settings = OnwardSettings()
        if cfg.pg_restarts:  # never restart a server somebody else uses: run our own
            self.pg = PrivatePostgres(prefix="onward-chaos-pg-").init()
            self.pg.start()
            self.admin_url = self.pg.url
            log(f"private PostgreSQL at 127.0.0.1:{self.pg.port} ({self.pg.root})")
        else:
            self.admin_url = database_url(admin_settings)
        self.db_name = f"onward_chaos_{secrets.token_hex(4)}"
        log(f"creating database {self.db_name}")
        self.db_url = create_database(self.admin_url, self.db_name)
        self.broker, self.owns_broker_db = choose_broker_db(broker_url(admin_settings),
                                                            cfg.broker_db)
        self.queue = f"chaos.{secrets.token_hex(6)}"
        log(f"broker {self.broker} (queue {self.queue})")
        self.provider = Provider(self.workdir)
        self.provider.configure(key_ttl_s=cfg.key_ttl_s, lookup=True, async_complete_s=0.0)
        if cfg.blind_runs:
            self.provider.arm(BLIND_COLLECTION, drop_response=cfg.blind_runs)
        log(f"provider at {self.provider.url} (key_ttl_s={cfg.key_ttl_s})")
        env = {
            "ONWARD_DATABASE_URL": self.db_url,
            "ONWARD_BROKER_URL": self.broker,
            "ONWARD_HOME": str(admin_settings.home_dir),
            "ONWARD_QUEUE": self.queue,
            "ONWARD_WORKFLOWS": "bench.chaos_agent",
            "ONWARD_CHECKPOINT_KEY": CHECKPOINT_KEY,
            "ONWARD_LEASE_TTL_S": str(cfg.lease_ttl_s),
            "ONWARD_REAPER_INTERVAL_S": "0.5",
            "ONWARD_OUTBOX_GRACE_S": "1",
            "ONWARD_OUTBOX_REPUBLISH_S": "5",
            "ONWARD_STALL_AFTER_S": "5",
            "ONWARD_DISPATCHER_POLL_S": "0.5",
            "ONWARD_RETRY_BASE_S": "0.1",
            "ONWARD_RETRY_MAX_S": "1",
            "ONWARD_EXAMPLE_PROVIDER_URL": self.provider.url,
        }
        settings = OnwardSettings(database_url=self.db_url, broker_url=self.broker,
                                  home=admin_settings.home_dir, queue=self.queue,
                                  checkpoint_key=CHECKPOINT_KEY)
        self.ledger = Ledger.from_env(settings)
        self.engine = self.ledger.engine
        self.fleet = Fleet(env, self.workdir / "logs", self.workdir / "faults",
                           concurrency=cfg.concurrency)
        (self.workdir / "logs").mkdir(exist_ok=True)
        for slot in range(cfg.dispatchers):
            self.fleet.dispatcher(slot)
        self.fleet.reaper()
        for slot in range(2):
            self.fleet.worker(slot)
        deadline = time.monotonic() + 180
        while len(self.fleet.workers_ready()) < 2:
            for proc in self.fleet.all:
                if not proc.alive():
                    raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}) while "
                                       f"starting:\n{proc.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("workers not ready after 180 s:\n" + "\n".join(
                    p.log_text()[-2000:] for p in self.fleet.live("worker")))
            time.sleep(0.2)
        log(f"fleet ready: 2 workers x {cfg.concurrency} children, "
            f"{cfg.dispatchers} dispatchers, 1 reaper; lease {cfg.lease_ttl_s}s")

    # -- scheduling ----------------------------------------------------------------------
    def schedule(self, delay: float, kind: str, arg: Any = None) -> None:
        heapq.heappush(self.heap, Item(self.now() + delay, next(self.order), kind, arg))

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- chaos actions -------------------------------------------------------------------
    def start_runs(self, arg: tuple[int, int]) -> None:
        first, count = arg
        ids = []
        for i in range(first, first + count):
            blind_at = self.blind_plan.get(i, -1)
            run_id = self.ledger.start_run(
                WORKFLOW,
                {"steps": self.cfg.steps, "blind_at": blind_at, "pause_ms": self.cfg.pause_ms},
                idempotency_key=f"chaos:{self.cfg.seed}:{self.db_name}:{i}",
                max_attempts=MAX_ATTEMPTS,
            )
            ids.append(run_id)
            if blind_at >= 0:
                self.blind[run_id] = blind_at
        self.run_ids.extend(ids)
        log(f"t={self.now():5.1f}s started runs {first}..{first + count - 1} "
            f"({len(self.run_ids)}/{self.cfg.runs})")

    def lease_holders(self) -> dict[int, Proc]:
        """Pool children that hold a live lease right now, with their worker."""
        with self.engine.connect() as conn:
            owners = conn.execute(sa.text(
                "SELECT lease_owner FROM onward.runs WHERE status = 'running' "
                "AND lease_owner IS NOT NULL AND lease_expires_at > now() "
                "AND id = ANY(:ids)"), {"ids": self.run_ids}).scalars().all()
        pids = set()
        for owner in owners:
            with contextlib.suppress(ValueError):
                pids.add(int(owner.rsplit(":", 1)[1]))
        found = {}
        for worker in self.fleet.live("worker"):
            for child in worker.children():
                if (child in pids and child not in self.killed_pids
                        and child not in self.stopped and not is_stopped(child)):
                    found[child] = worker
        return found

    def idle_children(self, worker: Proc) -> list[int]:
        """Pool children that may be killed: not already killed, not SIGSTOPped."""
        return [c for c in worker.children() if c not in self.killed_pids
                and c not in self.stopped and not is_stopped(c)]

    def kill_child(self, tries: int) -> None:
        holders = self.lease_holders()
        if not holders and tries < 8:
            self.schedule(0.25, "kill_child", tries + 1)
            return
        if holders:
            pid = self.rng.choice(sorted(holders))
            worker = holders[pid]
            how = "lease holder"
        else:
            # A prefork child killed while its pool is still starting makes Celery give up
            # ("Could not start worker processes"): idle children only of settled workers.
            workers = [w for w in self.fleet.workers_ready(for_s=3.0) if self.idle_children(w)]
            if not workers:
                if tries < 60:
                    self.schedule(0.5, "kill_child", tries + 1)
                else:
                    log(f"t={self.now():5.1f}s kill_child: no worker child to kill, skipped")
                    self.events["kill_child_skipped"] += 1
                return
            worker = self.rng.choice(workers)
            pid = self.rng.choice(self.idle_children(worker))
            how = "idle child (no lease held)"
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            self.killed_pids.add(pid)
            self.kills["worker_child"] += 1
            if holders:
                self.kills_detail["worker_child_lease_holder"] += 1
            log(f"t={self.now():5.1f}s SIGKILL {how} pid {pid} of {worker.name}")

    def kill_tree(self, arg: tuple[str, int]) -> None:
        """Kill a whole worker (a host dying). Only a worker that is up and whose armed
        fault point has fired is a candidate, so that every point gets its chance; after
        ~20 s of waiting any live worker will do."""
        point, tries = arg
        ready = [w for w in self.fleet.workers_ready()
                 if not any(c in self.stopped or is_stopped(c) for c in w.children())]
        workers = [w for w in ready if self.fleet.fired_in(w)]
        if not workers and tries < 40:
            self.schedule(0.5, "kill_tree", (point, tries + 1))
            return
        workers = workers or ready
        if not workers:
            self.schedule(0.5, "kill_tree", (point, tries + 1))
            return
        worker = self.rng.choice(workers)
        children = len(worker.children())
        worker.kill_tree()
        self.kills["worker_tree"] += 1
        faults = ",".join(filter(None, [point, self.fleet.unfired(worker)]))  # carry over
        delay = self.rng.uniform(0.2, 2.0)
        log(f"t={self.now():5.1f}s SIGKILL worker tree {worker.name} ({children} children); "
            f"restart in {delay:.1f}s" + (f" with {faults}" if faults else ""))
        self.schedule(delay, "restart_worker", (worker.slot, faults))

    def pause_holder(self, tries: int) -> None:
        """SIGSTOP a lease holder past its lease, then SIGCONT it: the stale holder resumes
        after another worker took the step over."""
        holders = self.lease_holders()
        if not holders:
            if tries < 40:
                self.schedule(0.25, "pause_holder", tries + 1)
            return
        pid = self.rng.choice(sorted(holders))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            self.events["pauses"] += 1
            self.track_stopped(pid, f"SIGSTOP lease holder pid {pid} of {holders[pid].name}")

    def track_stopped(self, pid: int, what: str) -> None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.text(
                "SELECT id, seq FROM onward.runs WHERE lease_owner LIKE :owner "
                "AND id = ANY(:ids)"), {"owner": f"%:{pid}", "ids": self.run_ids}).first()
        self.stopped[pid] = Stopped(pid, self.now() + 30.0, row.id if row else None,
                                    row.seq if row else None)
        log(f"t={self.now():5.1f}s {what}; SIGCONT once another worker has committed run "
            f"{row.id if row else '?'} seq {row.seq if row else '?'} (30 s at most)")

    def continue_stopped(self) -> None:
        for marker, pid in self.fleet.stop_markers():
            if marker not in self.stop_markers_seen:
                self.stop_markers_seen.add(marker)
                self.events["pauses_at_point"] += 1
                self.track_stopped(pid, f"pid {pid} stopped itself at after_effect_pending")
        for pid, stop in list(self.stopped.items()):
            if stop.taken_over_at is None and stop.run_id is not None:
                with self.engine.connect() as conn:
                    seq = conn.execute(sa.text("SELECT seq FROM onward.runs WHERE id = :id"),
                                       {"id": stop.run_id}).scalar_one()
                if stop.seq is not None and seq > stop.seq:
                    stop.taken_over_at = self.now()
            # half a second after the takeover committed: the provider forgot the key by then
            due = (stop.taken_over_at is not None and self.now() >= stop.taken_over_at + 0.5)
            if due or self.now() >= stop.max_at:
                del self.stopped[pid]
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    log(f"t={self.now():5.1f}s SIGCONT pid {pid} ("
                        + ("its step was committed by another worker" if due else
                           "no takeover within 30 s") + ")")
                    self.events["stale_holders_resumed_after_takeover" if due
                                else "stopped_resumed_without_takeover"] += 1

    def restart_worker(self, arg: tuple[int, str]) -> None:
        slot, faults = arg
        proc = self.fleet.worker(slot, faults)
        log(f"t={self.now():5.1f}s started {proc.name}" + (f" [{faults}]" if faults else ""))

    def restart_reaper(self, slot: int) -> None:
        proc = self.fleet.reaper(slot)
        log(f"t={self.now():5.1f}s started {proc.name}")

    def kill_dispatcher(self, point: str) -> None:
        live = [d for d in self.fleet.live("dispatcher") if self.fleet.fired_in(d)]
        if not live:  # none up, or the one up still waits for its armed point
            self.schedule(0.5, "kill_dispatcher", point)
            return
        proc = self.rng.choice(live)
        proc.kill_tree()
        self.kills["dispatcher"] += 1
        faults = f"{point}:kill:once" if point else ""
        delay = self.rng.uniform(0.5, 3.0)
        log(f"t={self.now():5.1f}s SIGKILL {proc.name}; restart in {delay:.1f}s"
            + (f" with {faults}" if faults else ""))
        self.schedule(delay, "restart_dispatcher", (proc.slot, faults))

    def restart_dispatcher(self, arg: tuple[int, str]) -> None:
        slot, faults = arg
        proc = self.fleet.dispatcher(slot, faults)
        log(f"t={self.now():5.1f}s started {proc.name}" + (f" [{faults}]" if faults else ""))

    def flush_broker(self) -> None:
        client = redis.Redis.from_url(self.broker)
        try:
            queued = sum(client.llen(key) for key in client.scan_iter(match=f"{self.queue}*")
                         if client.type(key) == b"list")
            keys = client.dbsize()
            client.flushdb()
            if self.owns_broker_db:  # keep the DB marked as taken for other users
                client.set(OWNER_KEY, OWNER_TOKEN, ex=3600)
        finally:
            client.close()
        self.events["broker_flushes"] += 1
        log(f"t={self.now():5.1f}s FLUSHDB {self.broker} ({keys} keys, {queued} queued "
            "step messages gone)")

    def provider_fault(self, kind: str, count: int) -> None:
        fault = "drop_response" if kind == "provider_drop" else "error_500"
        self.provider.arm(COLLECTION, **{fault: count})
        self.events[f"armed_{fault}"] += count
        log(f"t={self.now():5.1f}s provider: next {count} creates in {COLLECTION!r}: {fault}")

    def provider_async(self, seconds: float) -> None:
        self.provider.configure(async_complete_s=seconds)
        log(f"t={self.now():5.1f}s provider: async_complete_s={seconds}")

    def provider_slow(self, count: int) -> None:
        """The next ``count`` creates wait past the lease before the provider acts."""
        self.provider.arm(COLLECTION, slow=count, slow_s=self.cfg.long_call_s)
        self.events["armed_slow"] += count
        log(f"t={self.now():5.1f}s provider: next {count} creates in {COLLECTION!r} held "
            f"{self.cfg.long_call_s:.1f}s before acting (lease {self.cfg.lease_ttl_s}s)")

    def restart_postgres(self) -> None:
        """Crash our own PostgreSQL (``immediate``: no checkpoint, WAL recovery on start)
        and start it again a little later."""
        if self.pg is None:
            return
        if self.db_is_down():  # down, or back less than 10 s ago: one outage at a time
            self.schedule(5.0, "restart_postgres")
            return
        self.pg.stop("immediate")
        self.db_down = (self.now(), None)
        delay = self.rng.uniform(0.5, 3.0)
        log(f"t={self.now():5.1f}s PostgreSQL stopped (immediate); start in {delay:.1f}s")
        self.schedule(delay, "start_postgres")

    def start_postgres(self) -> None:
        """Start it in the background (crash recovery takes seconds on a busy machine, and
        the chaos goes on meanwhile); poll_postgres() notices when it is up."""
        assert self.pg is not None
        pg = self.pg
        starting = Starting(threading.Thread(target=lambda: starting.run(pg.start), daemon=True))
        self.pg_starting = starting
        starting.thread.start()

    def poll_postgres(self) -> None:
        starting = self.pg_starting
        if starting is None or starting.thread.is_alive():
            return
        self.pg_starting = None
        if starting.error is not None:
            log(f"t={self.now():5.1f}s PostgreSQL did not start ({starting.error!r}); "
                "trying again", always=True)
            self.schedule(1.0, "start_postgres")
            return
        assert self.db_down is not None
        self.db_down = (self.db_down[0], self.now())
        self.events["postgres_restarts"] += 1
        log(f"t={self.now():5.1f}s PostgreSQL started again "
            f"(down {self.now() - self.db_down[0]:.1f}s)")

    def db_is_down(self, grace_s: float = 10.0) -> bool:
        """Whether PostgreSQL is down, or came back less than ``grace_s`` ago."""
        if self.db_down is None:
            return False
        _stopped, started = self.db_down
        return started is None or self.now() < started + grace_s

    def kill_backend(self, arg: str | tuple[str, int]) -> None:
        """``pg_terminate_backend`` of one database connection of a worker or dispatcher
        (connections are told apart by the application_name each process was given)."""
        role, tries = (arg, 0) if isinstance(arg, str) else arg
        with self.engine.connect() as conn:
            backends = conn.execute(sa.text(
                "SELECT pid, application_name, state FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE :app"),
                {"app": f"{APP_PREFIX}{role}%"}).all()
            if not backends:
                if tries < 40:
                    self.schedule(0.25, "kill_backend", (role, tries + 1))
                return
            victim = self.rng.choice(backends)
            done = conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"),
                                {"pid": victim.pid}).scalar()
        if done:
            self.events["backend_kills"] += 1
            self.events[f"backend_kills_{role}"] += 1
        log(f"t={self.now():5.1f}s pg_terminate_backend({victim.pid}) of "
            f"{victim.application_name} ({victim.state}): {'done' if done else 'gone already'}")

    def check_processes(self) -> None:
        """Restart what died without us killing it (a dispatcher at its fault point, ...)."""
        for (role, slot), proc in list(self.fleet.current.items()):
            if proc.alive() or proc.killed_by_us or proc.pid in self.expected_dead:
                continue
            self.expected_dead.add(proc.pid)
            code = proc.popen.returncode
            if role == "dispatcher" and proc.faults and code == -signal.SIGKILL:
                log(f"t={self.now():5.1f}s {proc.name} killed itself at {DISPATCHER_POINT}; "
                    "restarting it")
                self.schedule(self.rng.uniform(0.3, 1.5), "restart_dispatcher", (slot, ""))
                continue
            delay = 0.5
            if self.db_is_down():  # e.g. started while PostgreSQL was down: it refuses to run
                delay = 2.0
                self.exits_while_db_down.append(f"{proc.name} exited {code}")
                log(f"t={self.now():5.1f}s {proc.name} exited ({code}) while PostgreSQL was "
                    f"down or just back; restarting it:\n{proc.log_text()[-600:]}")
            else:
                self.unexpected_exits.append(f"{proc.name} exited {code}")
                log(f"t={self.now():5.1f}s WARNING {proc.name} exited unexpectedly ({code}):\n"
                    f"{proc.log_text()[-2000:]}", always=True)
            if role == "worker":  # arm again what never fired
                faults = self.fleet.unfired(proc)
                self.schedule(delay, "restart_worker", (slot, faults))
            elif role == "dispatcher":
                self.schedule(delay, "restart_dispatcher", (slot, ""))
            else:
                self.schedule(delay, "restart_reaper", slot)

    def dispatch(self, item: Item) -> None:
        actions: dict[str, Callable[[Any], None]] = {
            "start_runs": self.start_runs,
            "kill_child": lambda arg: self.kill_child(arg or 0),
            "kill_tree": self.kill_tree,
            "pause_holder": lambda arg: self.pause_holder(arg or 0),
            "restart_worker": self.restart_worker,
            "kill_dispatcher": self.kill_dispatcher,
            "restart_dispatcher": self.restart_dispatcher,
            "restart_reaper": self.restart_reaper,
            "flush_broker": lambda _arg: self.flush_broker(),
            "provider_drop": lambda n: self.provider_fault("provider_drop", n),
            "provider_500": lambda n: self.provider_fault("provider_500", n),
            "provider_async": self.provider_async,
            "provider_slow": self.provider_slow,
            "restart_postgres": lambda _arg: self.restart_postgres(),
            "start_postgres": lambda _arg: self.start_postgres(),
            "kill_backend": self.kill_backend,
        }
        actions[item.kind](item.arg)

    def run_item(self, item: Item) -> None:
        """Do one planned action; one that failed on the database (down, restarting, its
        connection terminated) is tried again shortly, so no run wave or kill is lost."""
        try:
            self.dispatch(item)
        except Exception as exc:
            retry = (isinstance(exc, DB_ERRORS) or self.db_is_down()) and item.retries < 120
            log(f"t={self.now():5.1f}s action {item.kind} failed: {exc!r}"
                + ("; trying again in 0.5 s" if retry else ""), always=not retry)
            self.events[f"{item.kind}_{'retried' if retry else 'failed'}"] += 1
            if retry:
                heapq.heappush(self.heap, Item(self.now() + 0.5, next(self.order), item.kind,
                                               item.arg, item.retries + 1))

    def tolerant(self, read: Callable[[], T]) -> T | None:
        """``read()``, or None when the database does not answer right now."""
        try:
            return read()
        except DB_ERRORS as exc:
            log(f"t={self.now():5.1f}s database read failed ({type(exc).__name__}); "
                "next time")
            return None

    # -- progress ------------------------------------------------------------------------
    def status_counts(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT status, count(*), coalesce(sum(seq), 0) FROM onward.runs "
                "WHERE id = ANY(:ids) GROUP BY 1"), {"ids": self.run_ids}).all()
        counts = {status: int(n) for status, n, _ in rows}
        counts["steps"] = sum(int(s) for _, _, s in rows)
        return counts

    def progress(self) -> dict[str, int]:
        counts = self.status_counts()
        fired = len(self.fleet.fired())
        log(f"t={self.now():5.1f}s runs {len(self.run_ids)}/{self.cfg.runs}: "
            f"completed {counts.get('completed', 0)}, running {counts.get('running', 0)}, "
            f"parked {counts.get('needs_review', 0)}, failed {counts.get('failed', 0)}; "
            f"steps {counts['steps']}/{self.cfg.runs * self.cfg.steps}; "
            f"kills {sum(self.kills.values()) + fired} (points fired {fired}); "
            f"workers ready {len(self.fleet.workers_ready())}")
        return counts

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        started = time.monotonic()
        self.setup()
        indices = list(range(cfg.runs))
        self.rng.shuffle(indices)
        self.blind_plan = {i: self.rng.randrange(cfg.steps)
                           for i in indices[:min(cfg.blind_runs, cfg.runs)]}
        plan = make_plan(cfg, self.rng)
        self.heap = list(plan)
        heapq.heapify(self.heap)
        log(f"plan (seed {cfg.seed}): " + ", ".join(
            f"{k} x{n}" for k, n in Counter(i.kind for i in plan).items()))
        self.t0 = time.monotonic()
        last_progress = 0.0
        settle_deadline = cfg.window_s + cfg.settle_s
        settled = False
        while True:
            now = self.now()
            self.poll_postgres()
            self.tolerant(self.continue_stopped)
            while self.heap and self.heap[0].at <= now:
                self.run_item(heapq.heappop(self.heap))
            self.check_processes()
            counts = None
            if now - last_progress >= 5.0:
                last_progress = now
                counts = self.tolerant(self.progress)
            chaos_over = (not self.heap and not self.stopped and not self.db_is_down(0.0)
                          and len(self.run_ids) == cfg.runs)
            if chaos_over and now >= cfg.window_s * 0.5:
                counts = counts or self.tolerant(self.status_counts)
                if counts is not None and counts.get("running", 0) == 0:
                    settled = True
                    break
            if now > settle_deadline:
                log(f"t={now:5.1f}s DEADLINE: not settled after {settle_deadline:.0f}s",
                    always=True)
                break
            time.sleep(0.1)
        self.tolerant(self.progress)
        # Let reconcile and polls that are still in flight land before counting.
        time.sleep(1.0)
        report = self.count(settled)
        report["elapsed_s"] = round(time.monotonic() - started, 1)
        report["chaos_s"] = round(self.now(), 1)
        return report

    # -- counting ----------------------------------------------------------------------------
    def count(self, settled: bool) -> dict[str, Any]:
        cfg = self.cfg
        ids = self.run_ids
        stats = self.ledger.batch_stats(ids)
        with self.engine.connect() as conn:
            runs = {r.id: r for r in conn.execute(sa.text(
                "SELECT id, status, seq, parked_reason, result, restore_count "
                "FROM onward.runs WHERE id = ANY(:ids)"), {"ids": ids}).all()}
            effects = conn.execute(sa.text(
                "SELECT effect_id, effect_type, run_id, seq, status, provider_ref, reconciled "
                "FROM onward.effects WHERE run_id = ANY(:ids)"), {"ids": ids}).all()
            stale_commits = conn.execute(sa.text(
                "SELECT count(*) FROM onward.checkpoints c WHERE c.run_id = ANY(:ids) "
                "AND c.seq > 0 AND NOT EXISTS (SELECT 1 FROM onward.step_attempts a "
                " WHERE a.run_id = c.run_id AND a.lease_epoch = c.lease_epoch "
                " AND a.seq = c.seq - 1 AND a.outcome = 'committed')"),
                {"ids": ids}).scalar_one()
            effect_attempts = conn.execute(sa.text(
                "SELECT a.kind, coalesce(a.outcome, 'none'), count(*) "
                "FROM onward.effect_attempts a JOIN onward.effects e "
                "  ON e.effect_type = a.effect_type AND e.effect_id = a.effect_id "
                "WHERE e.run_id = ANY(:ids) GROUP BY 1, 2"), {"ids": ids}).all()
            step_outcomes = conn.execute(sa.text(
                "SELECT coalesce(outcome, 'open'), count(*) FROM onward.step_attempts "
                "WHERE run_id = ANY(:ids) GROUP BY 1"), {"ids": ids}).all()
            outbox_left = conn.execute(sa.text(
                "SELECT count(*) FROM onward.outbox o JOIN onward.runs r ON r.id = o.run_id "
                "WHERE o.run_id = ANY(:ids) AND r.status <> 'running'"),
                {"ids": ids}).scalar_one()

        # -- runs -----------------------------------------------------------------------------
        completed = {rid for rid, r in runs.items() if r.status == "completed"}
        parked = {rid for rid, r in runs.items() if r.status == "needs_review"}
        expected_parked = {rid for rid in parked
                           if rid in self.blind
                           and runs[rid].parked_reason == "effect_outcome_unknown"
                           and runs[rid].seq == self.blind[rid]}
        lost = [rid for rid in ids if rid not in completed and rid not in expected_parked]
        missing_runs = len(ids) - len(runs)
        short_runs = [rid for rid in completed if runs[rid].seq != cfg.steps]

        # -- effects in the ledger ------------------------------------------------------------
        by_key = {e.effect_id: e for e in effects}
        intents = Counter((e.run_id, e.seq) for e in effects)
        duplicate_intents = sum(n - 1 for n in intents.values() if n > 1)
        unconfirmed_ok = {e.effect_id for e in effects
                          if e.run_id in expected_parked and e.seq == self.blind[e.run_id]
                          and e.effect_type == "chaos.blind_write" and e.status == "pending"}
        orphans = [e for e in effects if e.status in ("pending", "accepted")
                   and e.effect_id not in unconfirmed_ok]
        completed_effects = [e for e in effects if e.status == "completed"]
        failed_effects = [e for e in effects if e.status == "failed"]

        # -- the provider, on its own -------------------------------------------------------
        pstats = self.provider.stats()
        objects = self.provider.objects()
        id_set = {str(i) for i in ids}
        per_key = Counter((o["collection"], o["idempotency_key"]) for o in objects)
        dup_by_key_own = sum(n - 1 for n in per_key.values() if n > 1)
        per_payload = Counter((o["body"].get("run"), o["body"].get("n")) for o in objects)
        dup_by_payload = sum(n - 1 for n in per_payload.values() if n > 1)
        foreign = [o for o in objects if o["body"].get("run") not in id_set]
        first_by_key: dict[str, dict[str, Any]] = {}
        for obj in sorted(objects, key=lambda o: o["created_at"]):
            first_by_key.setdefault(obj["idempotency_key"], obj)
        unconfirmed = 0
        not_completed_in_ledger = []
        for obj in objects:
            effect = by_key.get(obj["idempotency_key"])
            if effect is not None and effect.status == "completed":
                continue
            if obj["idempotency_key"] in unconfirmed_ok:
                unconfirmed += 1
                continue
            not_completed_in_ledger.append(obj)
        missing_at_provider = [e for e in completed_effects if e.effect_id not in first_by_key]
        ref_mismatch = [e for e in completed_effects if e.effect_id in first_by_key
                        and first_by_key[e.effect_id]["id"] != e.provider_ref]
        objects_by_payload: dict[tuple[str, int], str] = {}
        for obj in sorted(objects, key=lambda o: o["created_at"]):
            objects_by_payload.setdefault((obj["body"].get("run"), obj["body"].get("n")),
                                          obj["id"])
        missing_by_payload = 0
        result_mismatch = 0
        for rid in completed:
            refs = (runs[rid].result or {}).get("refs") or []
            for n in range(cfg.steps):
                object_id = objects_by_payload.get((str(rid), n))
                if object_id is None:
                    missing_by_payload += 1
                elif n >= len(refs) or refs[n] != object_id:
                    result_mismatch += 1
        expected_objects = (len(completed) * cfg.steps
                            + sum(runs[rid].seq for rid in expected_parked))

        seen_in_logs: Counter[str] = Counter()
        for proc in self.fleet.all:
            if proc.role != "worker":
                continue
            for line in proc.log_text().splitlines():
                if "stale delivery" in line:
                    match = re.search(r"reason=(\w+)", line)
                    seen_in_logs[f"stale:{match.group(1) if match else '?'}"] += 1
                elif "lease lost" in line:
                    seen_in_logs["lease_lost_result_discarded"] += 1
                elif "Could not start worker processes" in line and "Unrecoverable" in line:
                    seen_in_logs["celery_could_not_start_pool"] += 1

        fired = self.fleet.fired()
        fired_points = sorted(point for _role, point in fired)
        armed_points = sorted(
            spec.split(":")[0] + ("" if spec.split(":")[1] == "kill" else ":" + spec.split(":")[1])
            for _r, faults, _d in self.fleet.fault_dirs for spec in faults.split(",") if spec)
        kills = dict(self.kills)
        kills["named_points"] = sum(1 for _r, point in fired if ":" not in point)
        kills_detail = {**self.kills_detail,
                        "worker_child_idle": self.kills["worker_child"]
                        - self.kills_detail["worker_child_lease_holder"]}
        report: dict[str, Any] = {
            "runs": len(ids),
            "steps_per_run": cfg.steps,
            "kills": sum(kills.values()),
            "lost_runs": len(lost),
            "duplicate_provider_objects": int(pstats.get("duplicate_objects", 0)),
            "duplicate_commits": stats.duplicate_commits,
            "orphan_pending_effects": len(orphans),
            "parked": len(parked),
            "expected_parked": len(self.blind),
            "provider_objects": len(objects),
            "expected_provider_objects": expected_objects,
            "provider_objects_unconfirmed": unconfirmed,
            "duplicate_objects_by_payload": dup_by_payload,
            "provider_objects_not_completed_in_ledger": len(not_completed_in_ledger),
            "completed_effects_missing_at_provider": len(missing_at_provider),
            "provider_ref_mismatches": len(ref_mismatch),
            "result_ref_mismatches": result_mismatch,
            "completed_runs_missing_objects": missing_by_payload,
            "foreign_provider_objects": len(foreign),
            "duplicate_effect_intents": duplicate_intents,
            "stale_commits": stale_commits,
            "runs_with_gaps": stats.runs_with_gaps,
            "completed": len(completed),
            "failed": stats.failed,
            "restores": stats.restores,
            "stale_deliveries": stats.stale_deliveries,
            "steps_committed": stats.steps_committed,
            "completed_steps_reexecuted": stats.completed_steps_reexecuted,
            "uncommitted_attempts": stats.uncommitted_attempts,
            "reconciled_effects": sum(1 for e in effects if e.reconciled),
            "failed_effects": len(failed_effects),
            "kills_by_kind": kills,
            "child_kills_detail": kills_detail,
            "named_points_armed": armed_points,
            "named_points_fired": fired_points,
            "broker_flushes": self.events.get("broker_flushes", 0),
            "postgres_restarts": self.events.get("postgres_restarts", 0),
            "backend_kills": self.events.get("backend_kills", 0),
            "backend_kills_by_role": {role: self.events.get(f"backend_kills_{role}", 0)
                                      for role in ("worker", "dispatcher")},
            "long_calls": int(pstats.get("slow_requests", 0)),
            "long_call_s": cfg.long_call_s,
            "pauses": self.events.get("pauses", 0) + self.events.get("pauses_at_point", 0),
            "stale_holders_resumed_after_takeover":
                self.events.get("stale_holders_resumed_after_takeover", 0),
            "provider": {k: pstats.get(k, 0) for k in (
                "requests", "created", "dedupe_hits", "dropped_responses", "errors_500",
                "conflicts_409")},
            "effect_attempts": {f"{k}:{o}": int(n) for k, o, n in effect_attempts},
            "step_attempts": {o: int(n) for o, n in step_outcomes},
            "outbox_rows_of_finished_runs": outbox_left,
            "worker_log_events": dict(sorted(seen_in_logs.items())),
            "unexpected_exits": self.unexpected_exits,
            "exits_while_postgres_down": self.exits_while_db_down,
            "private_postgres": self.pg is not None,
            "settled": settled,
            "seed": cfg.seed,
            "database": self.db_name,
        }
        if lost:
            report["lost_run_detail"] = [
                {"run": str(rid), "status": runs[rid].status if rid in runs else None,
                 "seq": runs[rid].seq if rid in runs else None,
                 "parked_reason": runs[rid].parked_reason if rid in runs else None,
                 "blind_at": self.blind.get(rid)} for rid in lost[:10]]
        if orphans:
            report["orphan_detail"] = [
                {"run": str(e.run_id), "seq": e.seq, "type": e.effect_type, "status": e.status,
                 "run_status": runs[e.run_id].status} for e in orphans[:10]]
        if not_completed_in_ledger:
            report["not_completed_detail"] = [
                {"id": o["id"], "key": o["idempotency_key"][:16], "body": o["body"],
                 "ledger": by_key[o["idempotency_key"]].status
                 if o["idempotency_key"] in by_key else None}
                for o in not_completed_in_ledger[:10]]
        checks = {
            "settled": not settled,
            "lost_runs": report["lost_runs"] or missing_runs or short_runs,
            "duplicate_provider_objects": report["duplicate_provider_objects"] or dup_by_key_own,
            "duplicate_objects_by_payload": dup_by_payload,
            "duplicate_commits": report["duplicate_commits"],
            "orphan_pending_effects": report["orphan_pending_effects"],
            "parked != expected_parked": report["parked"] != report["expected_parked"],
            "provider_objects != expected + unconfirmed":
                len(objects) != expected_objects + unconfirmed,
            "provider_objects_not_completed_in_ledger": len(not_completed_in_ledger),
            "completed_effects_missing_at_provider": len(missing_at_provider),
            "provider_ref_mismatches": len(ref_mismatch),
            "result_ref_mismatches": result_mismatch,
            "completed_runs_missing_objects": missing_by_payload,
            "foreign_provider_objects": len(foreign),
            "duplicate_effect_intents": duplicate_intents,
            "stale_commits": stale_commits,
            "runs_with_gaps": stats.runs_with_gaps,
        }
        failures = [name for name, bad in checks.items() if bad]
        report["pass"] = not failures
        report["failures"] = failures
        return report

    # -- tear-down ---------------------------------------------------------------------------
    def teardown(self, keep_db: bool) -> None:
        with contextlib.suppress(Exception):
            self.fleet.stop_all()
        with contextlib.suppress(Exception):
            self.provider.stop()
        with contextlib.suppress(Exception):
            client = redis.Redis.from_url(self.broker)
            try:
                owner = client.get(OWNER_KEY)
                if self.owns_broker_db and owner == OWNER_TOKEN.encode():
                    client.flushdb()
                else:
                    for key in client.scan_iter(match=f"*{self.queue}*"):
                        client.delete(key)
            finally:
                client.close()
        with contextlib.suppress(Exception):
            self.engine.dispose()
        if self.pg_starting is not None:  # a start still under way: let it end first
            self.pg_starting.thread.join(timeout=70)
        if self.pg is not None:  # stopped either way; its files kept for inspection
            self.pg.destroy(keep=keep_db)
            if keep_db:
                log(f"kept the private PostgreSQL cluster {self.pg.data} (database "
                    f"{self.db_name}); start it with: {self.pg.start_command()}", always=True)
        elif hasattr(self, "db_name"):
            if keep_db:
                log(f"kept database {self.db_name} for inspection "
                    f"(ONWARD_DATABASE_URL={self.db_url})", always=True)
            else:
                with contextlib.suppress(Exception):
                    drop_database(self.admin_url, self.db_name)


def summary_lines(report: dict[str, Any]) -> list[str]:
    keys = ["runs", "kills", "lost_runs", "duplicate_provider_objects", "duplicate_commits",
            "orphan_pending_effects", "parked", "expected_parked", "provider_objects",
            "expected_provider_objects", "provider_objects_unconfirmed", "restores",
            "stale_deliveries", "postgres_restarts", "backend_kills", "long_calls",
            "elapsed_s"]
    lines = [f"  {k:28s} {report.get(k)}" for k in keys]
    lines.append(f"  {'kills_by_kind':28s} {report.get('kills_by_kind')}")
    lines.append(f"  {'named_points_fired':28s} {report.get('named_points_fired')}")
    lines.append(f"  {'provider':28s} {report.get('provider')}")
    lines.append(f"  {'PASS' if report.get('pass') else 'FAIL ' + str(report.get('failures'))}")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", "-R", type=int, default=40)
    p.add_argument("--steps", "-K", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--window", type=float, default=None,
                   help="seconds of chaos (runs are started during the first 70%%); default: "
                        "60 or 0.1 s per step of work (runs x steps), whichever is longer")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds after the window to wait for every run to settle; default: "
                        "150 or 30%% of the window, whichever is longer")
    p.add_argument("--pause-ms", type=int, default=300,
                   help="time each step spends around its effect (must stay under the lease)")
    per_minute = " (default: %s per minute of window)"
    p.add_argument("--child-kills", type=int, default=None,
                   help="SIGKILLs of a pool child" + per_minute % PER_MINUTE["child_kills"])
    p.add_argument("--tree-kills", type=int, default=None,
                   help="whole-worker kills; the 5 named worker points are armed, round-robin, "
                        "on the workers restarted after them" + per_minute
                        % PER_MINUTE["tree_kills"] + f", at most {DEFAULT_AT_MOST['tree_kills']}")
    p.add_argument("--dispatcher-kills", type=int, default=None,
                   help="the first restarts with dispatcher_after_publish_before_mark armed"
                        + per_minute % PER_MINUTE["dispatcher_kills"]
                        + f", at most {DEFAULT_AT_MOST['dispatcher_kills']}")
    p.add_argument("--dispatchers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=None,
                   help="pool children per worker (2 workers); default: 2, or 4 when runs x "
                        f"steps is above {BIG_BATCH_STEPS}")
    p.add_argument("--blind-runs", type=int, default=2,
                   help="runs with one write through a tool without lookup whose response "
                        "the provider drops: they must park (expected_parked)")
    p.add_argument("--drop-waves", type=int, default=None,
                   help="provider drops a response" + per_minute % PER_MINUTE["drop_waves"])
    p.add_argument("--error-waves", type=int, default=None,
                   help="provider answers 500" + per_minute % PER_MINUTE["error_waves"])
    p.add_argument("--pg-restarts", type=int, default=None,
                   help="PostgreSQL crashes and restarts, on a private server (0: use the "
                        "configured server, never restarted)"
                        + per_minute % PER_MINUTE["pg_restarts"]
                        + f", at least 1, at most {DEFAULT_AT_MOST['pg_restarts']}")
    p.add_argument("--backend-kills", type=int, default=None,
                   help="pg_terminate_backend of a worker's or dispatcher's connection"
                        + per_minute % PER_MINUTE["backend_kills"])
    p.add_argument("--long-calls", type=int, default=None,
                   help="creates the provider holds --long-call-s before acting"
                        + per_minute % PER_MINUTE["long_calls"])
    p.add_argument("--long-call-s", type=float, default=None,
                   help="how long a long call is held (default: the lease TTL + 1 s)")
    p.add_argument("--no-flush", action="store_true", help="do not FLUSHDB the broker")
    p.add_argument("--no-async", action="store_true", help="no asynchronous-completion period")
    p.add_argument("--key-ttl", type=float, default=0.2,
                   help="provider idempotency-key retention, seconds (short: resends would "
                        "duplicate)")
    p.add_argument("--lease-ttl", type=float, default=3.0)
    p.add_argument("--broker-db", type=int, default=None,
                   help="Redis DB number for the broker (it is flushed once!); default: the "
                        "first empty one in 1..14; -1: the configured URL as is")
    p.add_argument("--pauses", type=int, default=0,
                   help="SIGSTOP a lease holder; SIGCONT it once another worker has taken "
                        "over and committed its step (30 s at most): a stale holder resuming")
    p.add_argument("--stop-point", action="store_true",
                   help="also restart a worker with after_effect_pending:stop:once (the child "
                        "stops itself between recording the intent and calling the provider; "
                        "continued like --pauses); uses one of the --tree-kills restarts")
    p.add_argument("--keep", action="store_true", help="keep the database and the work dir")
    p.add_argument("--json", action="store_true", help="quiet stderr; the JSON line is always "
                                                       "printed on stdout")
    return p.parse_args(argv)


def config_of(a: argparse.Namespace) -> Config:
    """The bench's configuration; counts not given scale with the chaos window."""
    window = a.window if a.window is not None else max(60.0, a.runs * a.steps * 0.1)
    settle = a.settle if a.settle is not None else max(150.0, window * 0.3)

    def scaled(name: str, minimum: int = 0) -> int:
        given = getattr(a, name)
        if given is not None:
            return int(given)
        count = max(minimum, round(PER_MINUTE[name] * window / 60.0))
        return min(count, DEFAULT_AT_MOST.get(name, count))

    return Config(
        runs=a.runs, steps=a.steps, seed=a.seed, window_s=window, settle_s=settle,
        pause_ms=a.pause_ms, child_kills=scaled("child_kills"),
        tree_kills=scaled("tree_kills"), dispatcher_kills=scaled("dispatcher_kills"),
        dispatchers=max(1, a.dispatchers), blind_runs=a.blind_runs,
        drop_waves=scaled("drop_waves"), error_waves=scaled("error_waves"),
        flush=not a.no_flush, async_period=not a.no_async, key_ttl_s=a.key_ttl,
        lease_ttl_s=a.lease_ttl, broker_db=a.broker_db, keep=a.keep, pauses=a.pauses,
        stop_point=a.stop_point, pg_restarts=scaled("pg_restarts", minimum=1),
        backend_kills=scaled("backend_kills"), long_calls=scaled("long_calls"),
        long_call_s=a.long_call_s if a.long_call_s is not None else a.lease_ttl + 1.0,
        concurrency=a.concurrency or (4 if a.runs * a.steps > BIG_BATCH_STEPS else 2))


def main(argv: list[str] | None = None) -> int:
    global VERBOSE
    a = parse_args(argv)
    VERBOSE = not a.json
    cfg = config_of(a)
    if cfg.pause_ms / 1000.0 >= cfg.lease_ttl_s / 2:
        print("--pause-ms must stay well under the lease TTL", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix=f"onward-chaos-{cfg.seed}-"))
    log(f"work dir {workdir}", always=True)
    chaos = Chaos(cfg, workdir)
    report: dict[str, Any] | None = None
    code = 2
    try:
        report = chaos.run()
        code = 0 if report["pass"] else 1
    except KeyboardInterrupt:
        log("interrupted", always=True)
    except Exception:
        log("bench failed:\n" + traceback.format_exc(), always=True)
    finally:
        chaos.teardown(keep_db=cfg.keep or code == 1)
    if report is None:
        print(json.dumps({"error": "the bench did not complete", "seed": cfg.seed,
                          "work_dir": str(workdir)}))
        return code
    report["work_dir"] = str(workdir)
    for line in summary_lines(report):
        log(line, always=True)
    if code == 0 and not cfg.keep:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
        report.pop("work_dir")
    else:
        log(f"logs kept in {workdir}", always=True)
    print(json.dumps(report, default=str), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
