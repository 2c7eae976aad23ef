#!/usr/bin/env python
"""Runs waiting for a person cost nothing in the fleet; approving them resumes them at the
engine's normal throughput.

    .venv/bin/python bench/waiting.py                    # 10,000 runs, a report on stderr
    .venv/bin/python bench/waiting.py --runs 1000        # a quick check
    .venv/bin/python bench/waiting.py --json             # one JSON line on stdout

What it does, on real processes (the same ``onward`` commands an operator runs):

1. creates a database of its own on the configured PostgreSQL server (embedded by default, or
   ONWARD_DATABASE_URL), migrates it with ``ledger.migrate.upgrade`` and drops it at the end;
   uses a queue name of its own on the configured broker (embedded Redis, or
   ONWARD_BROKER_URL);
2. starts ``onward dispatcher``, ``onward reaper`` and ``onward worker -c 2`` (prefork) with
   ONWARD_WORKFLOWS=bench.waiting_agent, and measures an idle baseline: the fleet's CPU
   seconds over the measurement window with no run at all;
3. starts N runs of ``bench_waiting`` (bench/waiting_agent.py: its first step asks for an
   approval, its second finishes) with ``Ledger.start_run_txn`` in batched transactions
   (``--clients`` processes), and waits until every one waits for its approval. The rate of
   those first steps is the reference "normal throughput" of this fleet;
4. over the same window, with N runs waiting, measures:
   * fleet CPU: user + system seconds of the worker's process tree (main process and pool
     children), from psutil, compared with the idle baseline; the dispatcher's and reaper's
     CPU and the database backends' CPU (local servers only) are shown apart;
   * broker messages: every LPUSH/RPUSH to this bench's queues the broker executed during
     the window (counted with Redis MONITOR between two markers, so other users of a shared
     Redis do not count), plus what sits in those queues (LLEN) at the end;
   * leases held (sampled every 0.5 s), step attempts started, outbox rows;
5. approves every run through ``Ledger.approve`` (``--clients`` processes, one decision per
   transaction, each bound to the hash of the artifact it read from the approval), and
   measures approvals per second and ``resume_steps_per_s``;
6. checks the ledger: every run completed, two steps each, nothing committed twice.

Both step rates measure the same thing: draining N queued steps. While the runs are started
and while they are approved, the worker does not consume the bench's queues (Celery
``cancel_consumer``); once all N messages are queued it consumes again (``add_consumer``),
and the rate is N / (last commit - that moment), database clock. So the resume rate is the
engine's, not the pace of the approvers (``--no-pause`` approves while the worker consumes:
the rate is then that of whichever is slower). The worker's CPU per step is reported for
both phases too: on a shared machine it is steadier than wall-clock rates.

The dispatcher runs with ONWARD_OUTBOX_REPUBLISH_S=600 (``--republish-s``): with the default
30 s, a message still queued behind a backlog is published again after 30 s, 90 s, 210 s…
(the outbox cannot tell "queued" from "lost"), and each copy becomes a stale delivery; a
backlog of 10,000 steps on two cores takes longer than that to drain.

Progress and the report go to stderr; ``--json`` prints one line on stdout. Exits non-zero
when an invariant fails: a run not waiting or not completed, a lease or a broker message
while the runs wait, a step committed twice.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import secrets
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import redis  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sqlalchemy.engine import Engine  # noqa: E402

from bench.waiting_agent import APPROVER_ROLE, WORKFLOW  # noqa: E402
from harness.databases import create_database, drop_database, redact  # noqa: E402
from harness.errors import HarnessError as BenchFailed  # noqa: E402
from harness.processes import Proc, Processes  # noqa: E402
from harness.processes import wait_answers_ping as wait_ready  # noqa: E402
from ledger import Ledger  # noqa: E402
from ledger.db import database_url  # noqa: E402
from ledger.stats import BatchStats  # noqa: E402
from ledger.vocabulary import ApprovalStatus  # noqa: E402
from tasks.routing import version_queue, workflow_queue  # noqa: E402
from tasks.waiting import artifact_hash  # noqa: E402
from workers.broker import broker_url, redis_lists  # noqa: E402
from workers.settings import WorkerSettings  # noqa: E402

WORKFLOW_MODULE = "bench.waiting_agent"
STALL_S = 90.0  # no progress for this long: the bench gives up
STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[waiting {time.monotonic() - STARTED:6.1f}s] {message}", file=sys.stderr,
          flush=True)


# -- measurements -----------------------------------------------------------------------------
def tree_cpu(root: int) -> dict[int, float]:
    """user + system CPU seconds of a process and its descendants, by pid."""
    out: dict[int, float] = {}
    try:
        tree = [psutil.Process(root)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return out
    for proc in tree:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied,
                                 psutil.ZombieProcess):
            times = proc.cpu_times()
            out[proc.pid] = float(times.user + times.system)
    return out


def backends_cpu(engine: Engine) -> dict[int, float] | None:
    """CPU seconds of the PostgreSQL backends serving this database, when they are local
    processes we can read (None otherwise)."""
    with engine.connect() as conn:
        pids = conn.execute(sa.text(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")).scalars().all()
    out: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied,
                                 psutil.ZombieProcess):
            times = psutil.Process(pid).cpu_times()
            out[pid] = float(times.user + times.system)
    return out or None


def cpu_delta(before: dict[int, float] | None, after: dict[int, float] | None) -> float | None:
    if before is None or after is None:
        return None
    return sum(v - before.get(pid, 0.0) for pid, v in after.items())


class PushCounter:
    """Counts LPUSH/RPUSH commands on keys starting with ``prefix`` that the broker executes
    between two ECHO markers, using Redis MONITOR (so a shared Redis's other traffic does not
    count). ``available`` is False when MONITOR is refused (then nothing is counted)."""

    PUSHES = frozenset({"LPUSH", "RPUSH", "LPUSHX", "RPUSHX"})

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.marker = f"onward-bench-waiting-{secrets.token_hex(6)}"
        self.client = redis.Redis.from_url(url)
        self.pushes = 0
        self.error: Exception | None = None
        self._counting = False
        self._ended = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def available(self) -> bool:
        return self.error is None

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10)
        if self.error is None:
            self.client.echo(f"{self.marker}:start")

    def stop(self, timeout: float = 30.0) -> int:
        if self.error is None:
            self.client.echo(f"{self.marker}:end")
            if not self._ended.wait(timeout):
                self.error = BenchFailed("MONITOR did not see the end marker in time")
        self.client.close()
        return self.pushes

    def _run(self) -> None:
        try:
            with redis.Redis.from_url(self.url).monitor() as monitor:
                self._ready.set()
                while not self._ended.is_set():
                    command = monitor.next_command()["command"]
                    parts = command.split(" ", 2)
                    verb = parts[0].upper()
                    if verb == "ECHO" and len(parts) > 1 and parts[1].startswith(self.marker):
                        if parts[1].endswith(":start"):
                            self._counting = True
                        else:
                            self._ended.set()
                    elif (self._counting and verb in self.PUSHES and len(parts) > 1
                          and parts[1].startswith(self.prefix)):
                        self.pushes += 1
        except Exception as exc:  # MONITOR refused (ACL, managed Redis), connection lost
            self.error = exc
            self._ready.set()
            self._ended.set()


def counts(engine: Engine) -> dict[str, int]:
    """Runs by status, leases held, outbox rows and step attempts of this bench's database."""
    with engine.connect() as conn:
        row = conn.execute(sa.text("""
            SELECT count(*) FILTER (WHERE status = 'waiting') AS waiting,
                   count(*) FILTER (WHERE status = 'completed') AS completed,
                   count(*) FILTER (WHERE status = 'running') AS running,
                   count(*) FILTER (WHERE status NOT IN ('waiting', 'completed', 'running'))
                       AS other,
                   count(*) FILTER (WHERE lease_owner IS NOT NULL) AS leases,
                   coalesce(sum(seq), 0) AS seq_sum,
                   coalesce(sum(stale_deliveries), 0) AS stale,
                   (SELECT count(*) FROM onward.outbox) AS outbox_rows,
                   (SELECT coalesce(sum(publish_count), 0) FROM onward.outbox) AS publishes,
                   (SELECT count(*) FROM onward.step_attempts) AS attempts
              FROM onward.runs""")).mappings().one()
    return {k: int(v) for k, v in row.items()}


def db_now(engine: Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()


def wait_until(engine: Engine, procs: Processes, done: Callable[[dict[str, int]], bool],
               what: str, every_s: float = 2.0) -> dict[str, int]:
    """Poll the counts until ``done``; progress on stderr; fail on a stall or a dead process."""
    progress, moved, shown = -1, time.monotonic(), 0.0
    while True:
        now = counts(engine)
        if done(now):
            log(f"{what}: {fmt_counts(now)}")
            return now
        marker = now["seq_sum"] + now["completed"] + now["stale"]
        if marker != progress:
            progress, moved = marker, time.monotonic()
        elif time.monotonic() - moved > STALL_S:
            raise BenchFailed(f"no progress for {STALL_S:.0f}s waiting for {what}: "
                              f"{fmt_counts(now)}")
        if time.monotonic() - shown >= every_s:
            log(f"  {fmt_counts(now)}")
            shown = time.monotonic()
        procs.check_alive()
        time.sleep(0.2)


def fmt_counts(c: dict[str, int]) -> str:
    return (f"waiting {c['waiting']}  running {c['running']}  completed {c['completed']}  "
            f"other {c['other']}  leases {c['leases']}  outbox {c['outbox_rows']}")


def phase_rate(engine: Engine, seq: int, since: Any = None) -> tuple[float, float]:
    """(steps/s, seconds) of the committed attempts at ``seq``: from ``since`` (or the first
    claim) to the last commit, database clock."""
    with engine.connect() as conn:
        row = conn.execute(sa.text(
            "SELECT count(*), min(started_at), max(ended_at) FROM onward.step_attempts "
            "WHERE seq = :seq AND outcome = 'committed'"), {"seq": seq}).one()
    steps, first, last = int(row[0]), row[1], row[2]
    if not steps or last is None:
        return 0.0, 0.0
    seconds = max((last - (since or first)).total_seconds(), 1e-6)
    return steps / seconds, seconds


def batch_stats(ledger: Ledger, ids: list[UUID], chunk: int = 500) -> BatchStats:
    """Ledger.batch_stats, summed over chunks: its query grows with the square of the batch
    (correlated subqueries over materialized CTEs), and every count it returns is a sum over
    runs."""
    parts = [ledger.batch_stats(ids[i:i + chunk]).as_dict() for i in range(0, len(ids), chunk)]
    return BatchStats(**{name: sum(p[name] for p in parts)
                         for name in BatchStats.__dataclass_fields__})


class Consumers:
    """Stops and restarts the worker's consumption of the bench's queues (Celery remote
    control: cancel_consumer / add_consumer), so that a phase's N messages are all queued
    before the worker starts on them."""

    def __init__(self, app: Any, node: str, queues: list[str], enabled: bool) -> None:
        self.app = app
        self.node = node
        self.queues = queues
        self.enabled = enabled

    def _each(self, command: Callable[..., Any]) -> None:
        for queue in self.queues:
            if not command(queue, destination=[self.node], reply=True, timeout=10):
                raise BenchFailed(f"the worker did not answer {command.__name__}({queue})")

    def pause(self) -> None:
        if self.enabled:
            self._each(self.app.control.cancel_consumer)

    def resume(self) -> None:
        if self.enabled:
            self._each(self.app.control.add_consumer)


def wait_queued(engine: Engine, client: redis.Redis, queues: list[str], expected: int,
                procs: Processes, timeout: float = 300.0) -> None:
    """Wait until the dispatcher published every outbox row and ``expected`` messages are
    queued."""
    deadline = time.monotonic() + timeout
    while True:
        queued = sum(int(client.llen(k)) for q in queues for k in redis_lists(q))
        with engine.connect() as conn:
            unpublished = int(conn.execute(sa.text(
                "SELECT count(*) FROM onward.outbox WHERE published_at IS NULL")).scalar_one())
        if queued >= expected and not unpublished:
            return
        if time.monotonic() > deadline:
            raise BenchFailed(f"{queued}/{expected} messages queued, {unpublished} outbox rows "
                              f"unpublished after {timeout:.0f}s")
        procs.check_alive()
        time.sleep(0.2)


def settle(engine: Engine, client: redis.Redis, queues: list[str], procs: Processes,
           timeout: float = 120.0) -> None:
    """Wait until the bench's queues and the outbox are empty (duplicate messages left from
    the start would otherwise be consumed, as stale deliveries, inside the window)."""
    deadline = time.monotonic() + timeout
    while True:
        queued = sum(int(client.llen(k)) for q in queues for k in redis_lists(q))
        now = counts(engine)
        if not queued and not now["outbox_rows"] and not now["leases"]:
            break
        if time.monotonic() > deadline:
            raise BenchFailed(f"queues not drained after {timeout:.0f}s: {queued} queued, "
                              f"{fmt_counts(now)}")
        procs.check_alive()
        time.sleep(0.2)
    time.sleep(1.0)  # the last acks and heartbeats


@dataclass
class Window:
    seconds: float
    fleet_cpu_s: float
    control_cpu_s: float
    db_cpu_s: float | None
    pushes: int | None
    queue_len: int
    leases_max: int
    attempts: int
    stale: int
    outbox_rows: int
    publishes: int


def measure_window(seconds: float, *, worker: Proc, control: list[Proc], engine: Engine,
                   broker: str, queue: str, queues: list[str], procs: Processes) -> Window:
    """Fleet CPU, broker pushes, queue lengths, leases and attempts over ``seconds``."""
    client = redis.Redis.from_url(broker)
    counter = PushCounter(broker, queue)
    counter.start()
    before = counts(engine)
    fleet0 = tree_cpu(worker.pid)
    control0: dict[int, float] = {}
    for proc in control:
        control0.update(tree_cpu(proc.pid))
    db0 = backends_cpu(engine)
    start = time.monotonic()
    leases_max = before["leases"]
    while time.monotonic() - start < seconds:
        time.sleep(min(0.5, max(0.0, seconds - (time.monotonic() - start))))
        procs.check_alive()
        leases_max = max(leases_max, counts(engine)["leases"])
    fleet1 = tree_cpu(worker.pid)
    control1: dict[int, float] = {}
    for proc in control:
        control1.update(tree_cpu(proc.pid))
    db1 = backends_cpu(engine)
    elapsed = time.monotonic() - start
    pushes = counter.stop()
    after = counts(engine)
    queue_len = sum(int(client.llen(k)) for q in queues for k in redis_lists(q))
    client.close()
    if not counter.available:
        log(f"  MONITOR unavailable ({counter.error}); broker pushes not counted")
    return Window(
        seconds=elapsed,
        fleet_cpu_s=cpu_delta(fleet0, fleet1) or 0.0,
        control_cpu_s=cpu_delta(control0, control1) or 0.0,
        db_cpu_s=cpu_delta(db0, db1),
        pushes=pushes if counter.available else None,
        queue_len=queue_len,
        leases_max=max(leases_max, after["leases"]),
        attempts=after["attempts"] - before["attempts"],
        stale=after["stale"] - before["stale"],
        outbox_rows=after["outbox_rows"],
        publishes=after["publishes"] - before["publishes"],
    )


# -- database ---------------------------------------------------------------------------------
# -- the phases -------------------------------------------------------------------------------
_client: Ledger | None = None


def _init_client(settings: dict[str, Any]) -> None:
    global _client
    config = WorkerSettings(**settings)
    _client = Ledger(sa.create_engine(database_url(config), pool_size=1), config)


def _start_batch(numbers: range) -> list[UUID]:
    """Start one run per number, all in one transaction (Ledger.start_run_txn)."""
    assert _client is not None
    with _client.engine.begin() as conn:
        return [_client.start_run_txn(conn, WORKFLOW, {"n": n}) for n in numbers]


def _approve_chunk(chunk: list[tuple[UUID, Any]]) -> int:
    """Approve each (approval id, artifact it showed) in its own Ledger.approve transaction,
    bound to the hash of that artifact."""
    assert _client is not None
    for approval_id, artifact in chunk:
        _client.acting_as("bench", "approver", (APPROVER_ROLE,)).approve(
            approval_id, artifact_hash=artifact_hash(artifact))
    return len(chunk)


class Clients:
    """Application processes that start runs and approve them through the public Ledger API
    (processes, not threads: both are mostly Python work and round trips, and one process's
    GIL would make the clients, not the engine, the slowest part)."""

    def __init__(self, processes: int, settings: dict[str, Any]) -> None:
        context = multiprocessing.get_context("spawn")  # no inherited connections
        self.pool = ProcessPoolExecutor(max_workers=processes, mp_context=context,
                                        initializer=_init_client, initargs=(settings,))
        for _ in self.pool.map(_approve_chunk, [[]] * processes):  # import, connect now
            pass

    def start_runs(self, runs: int, batch: int) -> tuple[list[UUID], float]:
        """N runs in transactions of ``batch`` runs; returns (ids, runs started per s)."""
        began = time.monotonic()
        batches = [range(first, min(runs, first + batch)) for first in range(0, runs, batch)]
        ids = [run_id for chunk in self.pool.map(_start_batch, batches) for run_id in chunk]
        return ids, runs / max(time.monotonic() - began, 1e-6)

    def approve_all(self, ledger: Ledger, runs: int, chunk: int = 100) -> tuple[int, float]:
        """Approve every pending approval; returns (approved, seconds)."""
        pending = ledger.approvals(status=ApprovalStatus.PENDING, limit=runs + 100)
        if len(pending) != runs:
            raise BenchFailed(f"{len(pending)} pending approvals, expected {runs}")
        work = [(a.id, a.artifact) for a in pending]
        chunks = [work[i:i + chunk] for i in range(0, len(work), chunk)]
        began = time.monotonic()
        approved = sum(self.pool.map(_approve_chunk, chunks))
        return approved, time.monotonic() - began

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000, help="waiting runs (default 10000)")
    parser.add_argument("--window", type=float, default=10.0,
                        help="seconds of each measurement window (default 10)")
    parser.add_argument("--batch", type=int, default=500,
                        help="runs started per transaction (default 500)")
    parser.add_argument("--clients", type=int, default=4,
                        help="processes calling Ledger.start_run_txn and Ledger.approve "
                             "(default 4)")
    parser.add_argument("--concurrency", type=int, default=2,
                        help="pool processes of the one worker (default 2)")
    parser.add_argument("--loglevel", default="WARNING", help="of the onward processes")
    parser.add_argument("--republish-s", type=float, default=600.0,
                        help="ONWARD_OUTBOX_REPUBLISH_S of the dispatcher (default 600; see "
                             "the note in the module docstring)")
    parser.add_argument("--no-pause", action="store_true",
                        help="let the worker consume while runs are started and approved "
                             "(the rates then include the producer's pace)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the idle window before the runs start")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the database")
    parser.add_argument("--json", action="store_true", help="one JSON line on stdout")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.window <= 0 or args.batch < 1 or args.clients < 1:
        parser.error("--runs, --window, --batch and --clients must be positive")
    return args


def report(result: dict[str, Any], window: Window, baseline: Window | None) -> None:
    def s(value: float | None, unit: str = "s") -> str:
        return "n/a" if value is None else f"{value:.3f} {unit}"

    log("")
    log(f"{result['waiting_runs']} runs waiting for approval, over {window.seconds:.1f} s:")
    idle = f" (idle fleet, no run at all: {s(baseline.fleet_cpu_s)})" if baseline else ""
    log(f"  fleet CPU (worker + pool)    {s(window.fleet_cpu_s)}{idle}")
    idle = f" (idle: {s(baseline.control_cpu_s)})" if baseline else ""
    log(f"  dispatcher + reaper CPU      {s(window.control_cpu_s)}{idle}")
    idle = f" (idle: {s(baseline.db_cpu_s)})" if baseline else ""
    log(f"  database backends CPU        {s(window.db_cpu_s)}{idle}")
    pushes = "n/a" if window.pushes is None else str(window.pushes)
    log(f"  broker messages              {result['broker_messages_while_waiting']} "
        f"({pushes} pushed to the bench's queues, {window.queue_len} queued)")
    log(f"  leases held (max)            {window.leases_max}")
    log(f"  step attempts started        {window.attempts}")
    log(f"  stale deliveries consumed    {window.stale}")
    log(f"  outbox rows                  {window.outbox_rows}")
    log(f"first steps (ask for approval) {result['start_steps_per_s']:.0f} steps/s; approvals "
        f"{result['approve_per_s']:.0f}/s; resume {result['resume_steps_per_s']:.0f} steps/s "
        f"({result['resume_vs_start']:.2f}x the first steps)")


def _interrupt(signum: int, _frame: object) -> None:
    """SIGTERM takes the same path as Ctrl-C: stop every process, drop the database."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    base = WorkerSettings()
    admin_url = database_url(base)
    broker = broker_url(base)
    host = socket.gethostname()
    token = secrets.token_hex(4)
    queue = f"bench.waiting.{token}"
    # first steps go to the workflow's queue, later ones to its version's (tasks/routing.py)
    queues = [queue, workflow_queue(queue, WORKFLOW), version_queue(queue, WORKFLOW, 1)]
    log(f"database server {redact(admin_url)}, broker {redact(broker)}, queue {queue}")
    db_name, db_url = create_database(admin_url, "onward_bench_waiting")
    log(f"created and migrated database {db_name}")
    key = secrets.token_hex(32)
    env = {"ONWARD_DATABASE_URL": db_url, "ONWARD_BROKER_URL": broker,
           "ONWARD_HOME": str(base.home_dir), "ONWARD_QUEUE": queue,
           "ONWARD_CHECKPOINT_KEY": key, "ONWARD_WORKFLOWS": WORKFLOW_MODULE,
           "ONWARD_OUTBOX_REPUBLISH_S": str(args.republish_s)}
    config: dict[str, Any] = {"database_url": db_url, "broker_url": broker, "home": base.home_dir,
                              "queue": queue, "checkpoint_key": key,
                              "workflows": [WORKFLOW_MODULE], "actor": "bench"}
    settings = WorkerSettings(**config)
    engine = sa.create_engine(database_url(settings), pool_size=2)
    ledger = Ledger(engine, settings)
    log_dir = Path(tempfile.mkdtemp(prefix="onward-bench-waiting-"))
    procs = Processes(env=env, log_dir=log_dir)
    client = redis.Redis.from_url(broker)
    clients: Clients | None = None
    ok = False
    try:
        from tasks.workflow import Registry
        from workers.app import create_app

        onward = ["-m", "console"]
        control = [procs.start("dispatcher", [*onward, "dispatcher", "--loglevel", args.loglevel]),
                   procs.start("reaper", [*onward, "reaper", "--loglevel", args.loglevel])]
        node = f"bench-waiting-{os.getpid()}@{host}"
        worker = procs.start("worker", [*onward, "worker", "-c", str(args.concurrency), "--name",
                                        node, "--loglevel", args.loglevel])
        clients = Clients(args.clients, config)
        ping_app = create_app(settings, registry=Registry())
        wait_ready(ping_app, worker, node)
        log(f"dispatcher, reaper and `onward worker -c {args.concurrency}` ready "
            f"(logs in {log_dir})")
        measure = {"worker": worker, "control": control, "engine": engine, "broker": broker,
                   "queue": queue, "queues": queues, "procs": procs}
        baseline = None
        if not args.no_baseline:
            time.sleep(1.0)
            log(f"idle baseline: {args.window:.0f} s with no run")
            baseline = measure_window(args.window, **measure)  # type: ignore[arg-type]

        consumers = Consumers(ping_app, node, queues, enabled=not args.no_pause)
        paused = " (worker not consuming until all are queued)" if consumers.enabled else ""
        log(f"starting {args.runs} runs of {WORKFLOW} ({args.batch} per transaction, "
            f"{args.clients} processes){paused}")
        consumers.pause()
        ids, created_per_s = clients.start_runs(args.runs, args.batch)
        log(f"started {len(ids)} runs ({created_per_s:.0f} runs/s)")
        if consumers.enabled:
            wait_queued(engine, client, queues, args.runs, procs)
        start_t0, cpu0 = db_now(engine), tree_cpu(worker.pid)
        consumers.resume()
        wait_until(engine, procs, lambda c: c["waiting"] == args.runs, "all waiting")
        start_cpu_ms = (cpu_delta(cpu0, tree_cpu(worker.pid)) or 0.0) * 1000 / args.runs
        start_rate, _ = phase_rate(engine, 0, since=start_t0 if consumers.enabled else None)
        log(f"first steps: {start_rate:.0f} steps/s, {start_cpu_ms:.1f} ms of worker CPU each")
        settle(engine, client, queues, procs)
        log(f"measuring {args.window:.0f} s with {args.runs} runs waiting")
        window = measure_window(args.window, **measure)  # type: ignore[arg-type]
        still = counts(engine)
        if still["waiting"] != args.runs:
            raise BenchFailed(f"runs stopped waiting during the window: {fmt_counts(still)}")

        log(f"approving {args.runs} runs through Ledger.approve "
            f"({args.clients} processes){paused}")
        consumers.pause()
        approve_t0 = db_now(engine)
        approved, approve_s = clients.approve_all(ledger, args.runs)
        log(f"approved {approved} in {approve_s:.1f} s ({approved / approve_s:.0f}/s)")
        if consumers.enabled:
            wait_queued(engine, client, queues, args.runs, procs)
        resume_t0 = db_now(engine) if consumers.enabled else approve_t0
        cpu0 = tree_cpu(worker.pid)
        consumers.resume()
        wait_until(engine, procs, lambda c: c["completed"] == args.runs, "all completed")
        resume_cpu_ms = (cpu_delta(cpu0, tree_cpu(worker.pid)) or 0.0) * 1000 / args.runs
        resume_rate, resume_s = phase_rate(engine, 1, since=resume_t0)
        _, approve_to_done_s = phase_rate(engine, 1, since=approve_t0)
        log(f"resumed steps: {resume_rate:.0f} steps/s, {resume_cpu_ms:.1f} ms of worker CPU "
            "each")

        stats = batch_stats(ledger, ids)
        problems = []
        if stats.completed != args.runs or stats.steps_committed != 2 * args.runs:
            problems.append(f"{stats.completed}/{args.runs} completed, "
                            f"{stats.steps_committed} steps committed (expected "
                            f"{2 * args.runs})")
        if stats.duplicate_commits or stats.runs_with_gaps or stats.completed_steps_reexecuted:
            problems.append(f"a step was committed twice, skipped or re-executed: "
                            f"{stats.as_dict()}")
        messages = (window.pushes or 0) + window.queue_len
        if messages:
            problems.append(f"{messages} broker messages while the runs waited")
        if window.leases_max:
            problems.append(f"{window.leases_max} leases held while the runs waited")
        if window.attempts:
            problems.append(f"{window.attempts} step attempts started while the runs waited")

        result: dict[str, Any] = {
            "waiting_runs": args.runs,
            "window_s": round(window.seconds, 2),
            "fleet_cpu_s_while_waiting": round(window.fleet_cpu_s, 3),
            "fleet_cpu_s_idle": round(baseline.fleet_cpu_s, 3) if baseline else None,
            "control_cpu_s_while_waiting": round(window.control_cpu_s, 3),
            "db_cpu_s_while_waiting": (round(window.db_cpu_s, 3)
                                       if window.db_cpu_s is not None else None),
            "broker_messages_while_waiting": messages if window.pushes is not None else None,
            "broker_queue_len_while_waiting": window.queue_len,
            "leases_held_while_waiting": window.leases_max,
            "step_attempts_while_waiting": window.attempts,
            "start_steps_per_s": round(start_rate, 1),
            "approve_per_s": round(approved / approve_s, 1),
            "resume_steps_per_s": round(resume_rate, 1),
            "resume_vs_start": round(resume_rate / start_rate, 3) if start_rate else None,
            "resume_s": round(resume_s, 2),
            "worker_cpu_ms_per_first_step": round(start_cpu_ms, 2),
            "worker_cpu_ms_per_resumed_step": round(resume_cpu_ms, 2),
            "approve_to_all_completed_s": round(approve_to_done_s, 2),
            "consumers_paused_while_queueing": consumers.enabled,
            "runs_created_per_s": round(created_per_s, 1),
            "stale_deliveries": stats.stale_deliveries,
            "duplicate_commits": stats.duplicate_commits,
            "worker": f"1 x onward worker -c {args.concurrency} (prefork)",
            "client_processes": args.clients,
            "outbox_republish_s": args.republish_s,
            "elapsed": round(time.monotonic() - STARTED, 1),
        }
        report(result, window, baseline)
        for problem in problems:
            log(f"FAILED: {problem}")
        if args.json:
            print(json.dumps(result), flush=True)
        ok = not problems
    except BenchFailed as exc:
        log(f"failed: {exc}")
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        log("stopping processes")
        if clients is not None:
            clients.close()
        procs.stop_all()
        with contextlib.suppress(redis.RedisError):
            client.delete(*(k for q in queues for k in redis_lists(q)))
        client.close()
        engine.dispose()
        if args.keep_db:
            log(f"kept database {db_name}")
        else:
            drop_database(admin_url, db_name)
        if not ok:
            log(f"process logs are in {log_dir}")
        log(f"done in {time.monotonic() - STARTED:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
