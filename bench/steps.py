#!/usr/bin/env python
"""onward steps/s and step-to-step latency, next to plain Celery and the bare durable
transaction, all measured in the same run.

    .venv/bin/python bench/steps.py                 # 3 interleaved rounds, a table
    .venv/bin/python bench/steps.py --json          # one JSON line on stdout
    .venv/bin/python bench/steps.py --rounds 1 --profile /tmp/prof   # cProfile the workers

Scenarios, per round, in an order rotated from round to round:

* onward chain: 1 run of ``test_chain`` (tests/workflows.py) x 2,000 no-op steps;
* onward fan-out: 200 runs x 10 steps, started in one transaction;
* plain Celery chain and fan-out: the same shapes with no durability (bench/plain_celery.py:
  each no-op task ``apply_async``s the next);
* bare durable transaction (bench/baretx.py): UPDATE run + INSERT checkpoint + INSERT outbox +
  COMMIT, 4 client processes, on the bench's database.

Workers: by default ONE ``onward worker -c 2`` (prefork: 2 child processes) and ONE plain
Celery worker with the same flags and Celery settings, plus one ``onward dispatcher`` and one
``onward reaper``, all started once and warmed up before the rounds. The bench creates its own
database on the configured PostgreSQL server (embedded by default, or ONWARD_DATABASE_URL),
migrates it with ``ledger.migrate.upgrade`` and drops it at the end; it uses its own queue names
on the configured broker (embedded Redis, or ONWARD_BROKER_URL).

Throughput is end to end: onward from the commit of the runs' start (DB clock) to the last
run's ``finished_at``; plain Celery from just before the first publish to the start of the
last task. Latency is "step-to-step": the start of step k to the start of step k+1 of the
chain; for onward ``step_attempts.started_at`` (the claim statement's ``now()``) of seq k+1
minus that of seq k, for plain Celery ``time.time()`` at the top of task k+1 minus task k.
Reported values are medians over rounds (min-max); ratios are medians of per-round ratios.
"Worker CPU ms/step" (user+system CPU of the worker process trees, plus PostgreSQL backend CPU
when the server is local) is printed too: on a shared, busy machine it is far steadier than
steps/s, and a CPU-bound system's throughput follows it. Progress goes to stderr.

Eager continuation (a worker runs a run's next steps itself after a commit, up to
ONWARD_EAGER_STEPS / ONWARD_EAGER_WINDOW_MS per message) is on by default, and the targets are
judged on the defaults. So that the broker path stays in view, a third onward stack with
ONWARD_EAGER_STEPS=0 (every step through the broker) runs in the same rounds and is printed
beside it; ``--no-broker-path`` leaves it out.

A/B of a hot-path change without editing the product: ``--variant MODULE`` starts a second
onward stack (own database, queue, dispatcher, reaper, workers) whose processes run as
``python -m MODULE worker|dispatcher|reaper``; MODULE patches what it tests, then runs the
onward CLI (``runpy.run_module("console", run_name="__main__")``). ``--variant-env K=V`` sets
environment for that stack only (e.g. ONWARD_OUTBOX_GRACE_S=60). ``--celery-variant
tuned,events`` adds a plain Celery side with other settings. ``--variant-db-role ROLE``
connects the variant stack's processes as ROLE: ``onward_operator`` measures what the
row-level security policies cost (docs/security.md) against the default stack, whose
superuser bypasses them.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import pstats
import secrets
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import redis  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sqlalchemy.engine import Engine, make_url  # noqa: E402

from bench import baretx  # noqa: E402
from bench.plain_celery import TASK as PLAIN_TASK  # noqa: E402
from bench.plain_celery import make_app, record_keys  # noqa: E402
from harness.brokers import amqp_depths, delete_amqp_queues  # noqa: E402
from harness.databases import create_database, drop_database, redact  # noqa: E402
from harness.errors import HarnessError as BenchFailed  # noqa: E402
from harness.processes import Proc, Processes  # noqa: E402
from harness.processes import wait_answers_ping as wait_ready  # noqa: E402
from ledger import Ledger  # noqa: E402
from ledger.db import database_url, libpq_conninfo  # noqa: E402
from tasks.routing import worker_queues  # noqa: E402
from tasks.workflow import Registry  # noqa: E402
from workers.broker import broker_url  # noqa: E402
from workers.settings import WorkerSettings  # noqa: E402

WORKFLOW = "test_chain"  # tests/workflows.py: `tick` runs `steps` times, then finishes
WORKFLOW_MODULE = "tests.workflows"
STALL_S = 60.0  # no progress for this long: the scenario is declared stuck


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- measurements helpers ---------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class CpuMeter:
    """Machine-wide busy share from /proc/stat (100 = every core busy); None elsewhere."""

    @staticmethod
    def sample() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as handle:
                fields = [int(x) for x in handle.readline().split()[1:]]
        except OSError:
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    @staticmethod
    def busy(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
        if before is None or after is None or after[0] == before[0]:
            return None
        total, idle = after[0] - before[0], after[1] - before[1]
        return 100.0 * (total - idle) / total


class CpuAccount:
    """CPU seconds (user + system) used by some process trees, and optionally by the
    PostgreSQL backends serving one database (readable only when the server is local)."""

    def __init__(self, roots: list[int], engine: Engine | None = None) -> None:
        self.roots = roots
        self.engine = engine

    @staticmethod
    def _cpu(proc: psutil.Process) -> float:
        try:
            times = proc.cpu_times()
            return float(times.user + times.system)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return 0.0

    def sample(self) -> dict[int, float]:
        """CPU seconds by pid (python processes); PG backends under negative keys."""
        out: dict[int, float] = {}
        for root in self.roots:
            try:
                tree = [psutil.Process(root)]
                tree += tree[0].children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for proc in tree:
                out[proc.pid] = self._cpu(proc)
        if self.engine is not None:
            with self.engine.connect() as conn:
                pids = conn.execute(sa.text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()")).scalars().all()
            for pid in pids:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    out[-pid] = self._cpu(psutil.Process(pid))
        return out

    @staticmethod
    def delta(before: dict[int, float], after: dict[int, float]) -> tuple[float, float | None]:
        """(python CPU s, PG backend CPU s or None) between two samples."""
        py = sum(v - before.get(k, 0.0) for k, v in after.items() if k > 0)
        pg_keys = [k for k in after if k < 0]
        pg = sum(after[k] - before.get(k, 0.0) for k in pg_keys) if pg_keys else None
        return py, pg


@dataclass
class Result:
    steps: int
    seconds: float
    s2s_ms: list[float]  # chain only
    handoff_ms: list[float]  # onward chain only: ended_at(k) -> started_at(k+1)
    cpu: float | None
    detail: dict[str, Any]

    @property
    def per_s(self) -> float:
        return self.steps / self.seconds

    def cpu_ms_per_step(self, key: str) -> float | None:
        value = self.detail.get(key)
        return None if value is None else value * 1000 / self.steps


class Queues:
    """Depth of a side's broker queues: Redis lists named ``prefix*`` (onward may route each
    workflow version to its own queue, ``<queue>.<workflow>.v<version>``), or on RabbitMQ
    the ready messages of the queues the side uses (a passive declare each)."""

    def __init__(self, client: redis.Redis | None, amqp: Any = None) -> None:
        self.client = client  # None on RabbitMQ
        self.amqp = amqp  # a Celery app whose connection reaches RabbitMQ

    def depth(self, prefix: str) -> int:
        if self.client is not None:
            total = 0
            for key in self.client.scan_iter(match=f"{prefix}*", count=1000):
                if self.client.type(key) == b"list":
                    total += int(self.client.llen(key))
            return total
        names = [prefix, f"{prefix}.{WORKFLOW}", f"{prefix}.{WORKFLOW}.v1"]
        return sum(amqp_depths(self.amqp, names).values())

    def delete(self, prefix: str) -> None:
        if self.client is not None:
            keys = [*self.client.scan_iter(match=f"{prefix}*", count=1000),
                    *self.client.scan_iter(match=f"_kombu.binding*.{prefix}*", count=1000)]
            if keys:
                self.client.delete(*keys)
        else:  # every queue an onward worker of the bench declared (one per workflow version)
            registry = Registry()
            registry.load_modules([WORKFLOW_MODULE])
            delete_amqp_queues(self.amqp, [prefix, *(q for q, _, _ in
                                                     worker_queues(prefix, registry))])


def drain(queues: Queues, prefix: str, procs: Processes, timeout: float = 120.0) -> int:
    """Wait until the side's queues are empty, so that leftover (duplicate) messages are not
    processed during the next scenario; return how many were left at the start."""
    left = queues.depth(prefix)
    deadline = time.monotonic() + timeout
    while queues.depth(prefix) and time.monotonic() < deadline:
        procs.check_alive()
        time.sleep(0.1)
    return left


# -- the sides ---------------------------------------------------------------------------------
class OnwardSide:
    """Runs of ``test_chain`` through one onward stack (its own database, queue, processes)."""

    def __init__(self, ledger: Ledger, procs: Processes, account: CpuAccount,
                 queues: Queues) -> None:
        self.ledger = ledger
        self.engine: Engine = ledger.engine
        self.procs = procs
        self.account = account
        self.queues = queues

    def run(self, runs: int, steps: int) -> Result:
        with self.engine.begin() as conn:
            ids = [self.ledger.start_run_txn(conn, WORKFLOW, {"steps": steps})
                   for _ in range(runs)]
            t0 = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
        before, cpu_before = CpuMeter.sample(), self.account.sample()
        self._wait(ids, runs * steps)
        after, cpu_after = CpuMeter.sample(), self.account.sample()
        py_cpu, pg_cpu = CpuAccount.delta(cpu_before, cpu_after)
        leftover = drain(self.queues, WorkerSettings.of(self.ledger.settings).queue, self.procs)
        with self.engine.connect() as conn:
            seconds = float(conn.execute(sa.text(
                "SELECT extract(epoch FROM max(finished_at) - :t0) FROM onward.runs "
                "WHERE id = ANY(:ids)"), {"t0": t0, "ids": ids}).scalar_one())
            s2s: list[float] = []
            handoff: list[float] = []
            if runs == 1:
                rows = conn.execute(sa.text(
                    "SELECT seq, extract(epoch FROM started_at)::float8, "
                    "extract(epoch FROM ended_at)::float8 FROM onward.step_attempts "
                    "WHERE run_id = :id AND outcome = 'committed' ORDER BY seq"),
                    {"id": ids[0]}).all()
                for prev, cur in itertools.pairwise(rows):
                    s2s.append((cur[1] - prev[1]) * 1000)
                    handoff.append((cur[1] - prev[2]) * 1000)
        stats = self.ledger.batch_stats(ids)
        bad = {k: v for k, v in stats.as_dict().items()
               if k in ("failed", "parked", "duplicate_commits", "runs_with_gaps",
                        "completed_steps_reexecuted", "uncommitted_attempts") and v}
        if stats.completed != runs or stats.steps_committed != runs * steps or bad:
            raise BenchFailed(f"onward run check failed: {stats.as_dict()}")
        return Result(runs * steps, seconds, s2s, handoff, CpuMeter.busy(before, after),
                      {"stale_deliveries": stats.stale_deliveries, "py_cpu_s": py_cpu,
                       "pg_cpu_s": pg_cpu, "leftover_messages": leftover})

    def _wait(self, ids: list[UUID], total_steps: int) -> None:
        query = sa.text("SELECT count(*) FILTER (WHERE status <> 'running'), "
                        "coalesce(sum(seq), 0) FROM onward.runs WHERE id = ANY(:ids)")
        progress, moved = -1, time.monotonic()
        with self.engine.connect() as conn:
            while True:
                finished, seq_sum = conn.execute(query, {"ids": ids}).one()
                conn.rollback()
                if finished == len(ids):
                    return
                if seq_sum != progress:
                    progress, moved = seq_sum, time.monotonic()
                elif time.monotonic() - moved > STALL_S:
                    raise BenchFailed(f"onward stalled at {seq_sum}/{total_steps} steps")
                self.procs.check_alive()
                time.sleep(0.05)


class PlainSide:
    """Chains of plain Celery tasks (bench/plain_celery.py) on one queue."""

    def __init__(self, app: Any, client: redis.Redis, queue: str, procs: Processes,
                 account: CpuAccount, queues: Queues) -> None:
        self.app = app
        self.client = client  # where the plain tasks record their start times
        self.queues = queues
        self.queue = queue
        self.procs = procs
        self.account = account
        self.records_key, self.done_key = record_keys(queue)

    def run(self, runs: int, steps: int) -> Result:
        self.client.delete(self.records_key, self.done_key)
        ids = [str(uuid4()) for _ in range(runs)]
        before, cpu_before = CpuMeter.sample(), self.account.sample()
        t0 = time.time()
        with self.app.producer_or_acquire() as producer:
            for run_id in ids:
                self.app.send_task(PLAIN_TASK, kwargs={"run_id": run_id, "seq": 0,
                                                       "steps": steps},
                                   queue=self.queue, producer=producer)
        finished: list[float] = []
        progress, moved = -1, time.monotonic()
        while len(finished) < runs:
            item = self.client.blpop([self.done_key], timeout=0.5)
            if item is not None:
                finished.append(float(item[1].split()[1]))
                continue
            count = int(self.client.llen(self.records_key))
            if count != progress:
                progress, moved = count, time.monotonic()
            elif time.monotonic() - moved > STALL_S:
                raise BenchFailed(f"plain Celery stalled at {count}/{runs * steps} steps")
            self.procs.check_alive()
        after, cpu_after = CpuMeter.sample(), self.account.sample()
        py_cpu, _ = CpuAccount.delta(cpu_before, cpu_after)
        drain(self.queues, self.queue, self.procs)
        deadline = time.monotonic() + 10
        while int(self.client.llen(self.records_key)) < runs * steps:
            if time.monotonic() > deadline:
                raise BenchFailed("plain Celery: step records missing")
            time.sleep(0.05)
        records = [r.split() for r in self.client.lrange(self.records_key, 0, -1)]
        if len(records) != runs * steps:
            raise BenchFailed(f"plain Celery ran {len(records)} tasks, expected {runs * steps}")
        s2s: list[float] = []
        if runs == 1:
            starts = [float(t) for _, _, t in sorted(records, key=lambda r: int(r[1]))]
            s2s = [(b - a) * 1000 for a, b in itertools.pairwise(starts)]
        return Result(runs * steps, max(finished) - t0, s2s, [], CpuMeter.busy(before, after),
                      {"py_cpu_s": py_cpu})


# -- setup -------------------------------------------------------------------------------------
@dataclass
class OnwardStack:
    """One onward deployment for the bench: database, queue, dispatcher, reaper, workers."""

    name: str
    db_name: str
    db_url: str
    queue: str
    ledger: Ledger
    env: dict[str, str]
    pids: list[int]


def start_onward(name: str, launcher: str, extra_env: dict[str, str], *, admin_url: str,
                 broker: str, home: Path, token: str, procs: Processes,
                 args: argparse.Namespace, profile_env: dict[str, str], host: str,
                 stacks: list[OnwardStack], db_role: str | None = None,
                 ) -> tuple[OnwardStack, list[tuple[Proc, str]]]:
    db_name, db_url = create_database(admin_url, "onward_bench")
    log(f"{name}: created and migrated database {db_name}"
        + (f"; its processes connect as {db_role}" if db_role else ""))
    queue = f"bench.{token}.{name}"
    key = secrets.token_hex(32)
    env = {
        "ONWARD_DATABASE_URL": (make_url(db_url).set(username=db_role)
                                .render_as_string(hide_password=False) if db_role else db_url),
        "ONWARD_QUEUE": queue,
        "ONWARD_CHECKPOINT_KEY": key,
        **extra_env,
    }
    settings = WorkerSettings(database_url=db_url, broker_url=broker, home=home, queue=queue,
                              checkpoint_key=key, workflows=[WORKFLOW_MODULE])
    ledger = Ledger(sa.create_engine(database_url(settings), pool_size=2), settings)
    stack = OnwardStack(name, db_name, db_url, queue, ledger, env, [])
    stacks.append(stack)  # dropped at the end even if something below fails
    for role in ("dispatcher", "reaper"):
        proc = procs.start(f"{name}-{role}", ["-m", launcher, role, "--loglevel",
                                              args.loglevel], env)
        stack.pids.append(proc.pid)
    pending = []
    for i in range(args.workers):
        node = f"bench-{name}{i}-{os.getpid()}@{host}"
        worker_args = ["worker", "-c", str(args.concurrency), "--name", node,
                       "--loglevel", args.loglevel]
        if args.profile:
            argv = ["-m", "bench.profiled", launcher, *worker_args]
            worker_env = {**env, **profile_env, "BENCH_PROFILE_LABEL": name}
        else:
            argv, worker_env = ["-m", launcher, *worker_args], env
        pending.append((procs.start(f"{name}-worker{i}", argv, worker_env), node))
        stack.pids.append(pending[-1][0].pid)
    return stack, pending


def start_plain(name: str, variant: str, *, token: str, procs: Processes,
                args: argparse.Namespace, profile_env: dict[str, str],
                host: str) -> tuple[str, list[tuple[Proc, str]]]:
    queue = f"bench.{token}.{name}"
    pending = []
    for i in range(args.workers):
        node = f"bench-{name}{i}-{os.getpid()}@{host}"
        env = {"BENCH_PLAIN_QUEUE": queue, "BENCH_PLAIN_VARIANT": variant,
               "BENCH_CONCURRENCY": str(args.concurrency), "BENCH_NODE": node,
               "BENCH_LOGLEVEL": args.loglevel}
        argv = ["-m", "bench.plain_celery"]
        if args.profile:
            argv = ["-m", "bench.profiled", "plain"]
            env.update(profile_env, BENCH_PROFILE_LABEL=name)
        pending.append((procs.start(f"{name}-worker{i}", argv, env), node))
    return queue, pending


# -- summary -----------------------------------------------------------------------------------
def clean(values: list[float | None]) -> list[float]:
    return [v for v in values if v is not None and v == v]


def med(values: list[float | None]) -> float:
    ok = clean(values)
    return statistics.median(ok) if ok else float("nan")


def spread(values: list[float | None], fmt: str) -> str:
    ok = clean(values)
    if not ok:
        return "-"
    text = format(statistics.median(ok), fmt)
    if len(ok) > 1:
        text += f" ({format(min(ok), fmt)}-{format(max(ok), fmt)})"
    return text


def stack_series(side: str, col: Callable[..., list[Any]], ratio: Callable[..., list[Any]],
                 rate: Callable[[Result], float],
                 p: Callable[[float], Callable[[Result], float]]) -> dict[str, list[Any]]:
    """The figures of a second onward stack (``variant`` or ``broker``), keyed by its name."""
    def cpu(key: str) -> Callable[[Result], float | None]:
        return lambda res: res.cpu_ms_per_step(key)

    return {
        f"{side}_chain_per_s": col(f"{side}_chain", rate),
        f"{side}_fanout_per_s": col(f"{side}_fanout", rate),
        f"{side}_p50_ms": col(f"{side}_chain", p(50)),
        f"{side}_p99_ms": col(f"{side}_chain", p(99)),
        f"{side}_chain_vs_onward": ratio(f"{side}_chain", "onward_chain", rate),
        f"{side}_fanout_vs_onward": ratio(f"{side}_fanout", "onward_fanout", rate),
        f"{side}_chain_ratio_vs_celery": ratio(f"{side}_chain", "celery_chain", rate),
        f"{side}_fanout_ratio_vs_celery": ratio(f"{side}_fanout", "celery_fanout", rate),
        f"{side}_p50_ratio_vs_celery": ratio(f"{side}_chain", "celery_chain", p(50)),
        f"{side}_stale_fanout": col(f"{side}_fanout",
                                    lambda res: res.detail["stale_deliveries"]),
        f"{side}_chain_cpu_ms_per_step": col(f"{side}_chain", cpu("py_cpu_s")),
        f"{side}_fanout_cpu_ms_per_step": col(f"{side}_fanout", cpu("py_cpu_s")),
        f"{side}_chain_pg_cpu_ms_per_step": col(f"{side}_chain", cpu("pg_cpu_s")),
        f"{side}_fanout_pg_cpu_ms_per_step": col(f"{side}_fanout", cpu("pg_cpu_s")),
    }


def summarize(rounds: list[dict[str, Result]], sides: list[str]) -> dict[str, list[Any]]:
    def rate(res: Result) -> float:
        return res.per_s

    def p(q: float) -> Callable[[Result], float]:
        return lambda res: percentile(res.s2s_ms, q)

    def hp(q: float) -> Callable[[Result], float]:
        return lambda res: percentile(res.handoff_ms, q)

    def col(key: str, fn: Callable[[Result], float | None]) -> list[float | None]:
        return [fn(r[key]) for r in rounds]

    def ratio(a: str, b: str, fn: Callable[[Result], float]) -> list[float | None]:
        return [fn(r[a]) / fn(r[b]) for r in rounds]

    def bare(field: str) -> list[float | None]:
        return [r["bare_tx"].detail[field] for r in rounds]

    series: dict[str, list[Any]] = {
        "chain_steps_per_s": col("onward_chain", rate),
        "fanout_steps_per_s": col("onward_fanout", rate),
        "celery_chain_per_s": col("celery_chain", rate),
        "celery_fanout_per_s": col("celery_fanout", rate),
        "bare_tx_per_s": bare("tx_per_s"),
        "bare_tx_p50_ms": bare("p50_ms"),
        "chain_ratio_vs_celery": ratio("onward_chain", "celery_chain", rate),
        "fanout_ratio_vs_celery": ratio("onward_fanout", "celery_fanout", rate),
        "chain_vs_bare_tx": [r["onward_chain"].per_s / r["bare_tx"].detail["tx_per_s"]
                             for r in rounds],
        "fanout_vs_bare_tx": [r["onward_fanout"].per_s / r["bare_tx"].detail["tx_per_s"]
                              for r in rounds],
        "p50_ms": col("onward_chain", p(50)),
        "p99_ms": col("onward_chain", p(99)),
        "celery_p50_ms": col("celery_chain", p(50)),
        "celery_p99_ms": col("celery_chain", p(99)),
        "p50_ratio_vs_celery": ratio("onward_chain", "celery_chain", p(50)),
        "handoff_p50_ms": col("onward_chain", hp(50)),
        "handoff_p99_ms": col("onward_chain", hp(99)),
        "stale_chain": [r["onward_chain"].detail["stale_deliveries"] for r in rounds],
        "stale_fanout": [r["onward_fanout"].detail["stale_deliveries"] for r in rounds],
        "cpu_bare_tx": col("bare_tx", lambda res: res.cpu),
        "chain_cpu_ms_per_step": col("onward_chain", lambda res: res.cpu_ms_per_step("py_cpu_s")),
        "fanout_cpu_ms_per_step": col("onward_fanout",
                                      lambda res: res.cpu_ms_per_step("py_cpu_s")),
        "chain_pg_cpu_ms_per_step": col("onward_chain",
                                        lambda res: res.cpu_ms_per_step("pg_cpu_s")),
        "fanout_pg_cpu_ms_per_step": col("onward_fanout",
                                         lambda res: res.cpu_ms_per_step("pg_cpu_s")),
        "celery_chain_cpu_ms_per_step": col("celery_chain",
                                            lambda res: res.cpu_ms_per_step("py_cpu_s")),
        "celery_fanout_cpu_ms_per_step": col("celery_fanout",
                                             lambda res: res.cpu_ms_per_step("py_cpu_s")),
    }
    for side in sides:
        series[f"cpu_{side}_chain"] = col(f"{side}_chain", lambda res: res.cpu)
        series[f"cpu_{side}_fanout"] = col(f"{side}_fanout", lambda res: res.cpu)
    if "celery_variant" in sides:
        series.update({
            "celery_variant_chain_per_s": col("celery_variant_chain", rate),
            "celery_variant_fanout_per_s": col("celery_variant_fanout", rate),
            "celery_variant_p50_ms": col("celery_variant_chain", p(50)),
            "celery_variant_chain_cpu_ms_per_step": col(
                "celery_variant_chain", lambda res: res.cpu_ms_per_step("py_cpu_s")),
            "celery_variant_fanout_cpu_ms_per_step": col(
                "celery_variant_fanout", lambda res: res.cpu_ms_per_step("py_cpu_s")),
            "celery_variant_chain_vs_celery": ratio("celery_variant_chain", "celery_chain", rate),
            "celery_variant_fanout_vs_celery": ratio("celery_variant_fanout", "celery_fanout",
                                                     rate),
        })
    for side in ("variant", "broker"):
        if side in sides:
            series.update(stack_series(side, col, ratio, rate, p))
    if {"variant", "celery_variant"} <= set(sides):
        series.update({
            "variant_chain_vs_celery_variant": ratio("variant_chain", "celery_variant_chain",
                                                     rate),
            "variant_fanout_vs_celery_variant": ratio("variant_fanout", "celery_variant_fanout",
                                                      rate),
        })
    return series


def stack_lines(s: Callable[..., str], side: str) -> list[str]:
    """The table lines of a second onward stack; ``s(key, fmt)`` formats a series."""
    return [
        f"    chain {s(f'{side}_chain_per_s')} steps/s = {s(f'{side}_chain_vs_onward', '.2f')}"
        f" x onward, {s(f'{side}_chain_ratio_vs_celery', '.2f')} x plain Celery",
        f"    fan-out {s(f'{side}_fanout_per_s')} steps/s = "
        f"{s(f'{side}_fanout_vs_onward', '.2f')} x onward, "
        f"{s(f'{side}_fanout_ratio_vs_celery', '.2f')} x plain Celery; stale deliveries "
        f"{s(f'{side}_stale_fanout')}",
        f"    worker CPU ms/step chain {s(f'{side}_chain_cpu_ms_per_step', '.2f')}, fan-out "
        f"{s(f'{side}_fanout_cpu_ms_per_step', '.2f')}; PostgreSQL backends chain "
        f"{s(f'{side}_chain_pg_cpu_ms_per_step', '.2f')}, fan-out "
        f"{s(f'{side}_fanout_pg_cpu_ms_per_step', '.2f')}",
        f"    step-to-step p50 {s(f'{side}_p50_ms', '.2f')} ms, p99 "
        f"{s(f'{side}_p99_ms', '.2f')} ms; p50 {s(f'{side}_p50_ratio_vs_celery', '.2f')}"
        " x plain Celery's",
    ]


def print_table(series: dict[str, list[Any]], meta: dict[str, Any]) -> None:
    def s(key: str, fmt: str = ".0f") -> str:
        return spread(series[key], fmt) if key in series else "-"

    def pair(a: str, b: str, fmt: str = ".0f") -> str:
        return f"{s(a, fmt)} / {s(b, fmt)}"

    chain_label = f"chain 1 x {meta['chain_steps']}, steps/s"
    fanout_label = f"fan-out {meta['fanout_runs']} x {meta['fanout_steps']}, steps/s"
    lines = [
        "onward step throughput vs plain Celery (bench/steps.py)",
        f"  workers : {meta['workers_desc']}",
        f"  settings: {meta['settings_desc']}",
        f"  database: {meta['database']} (fresh database {meta['db_name']})",
        f"  broker  : {meta['broker']}  queues {meta['queues']}",
        f"  rounds  : {meta['rounds']} interleaved, order rotated; median (min-max); "
        "ratios are medians of per-round ratios",
        "",
        f"  {'scenario':<34}{'onward':>40}{'plain Celery':>40}{'onward/Celery':>19}",
        f"  {chain_label:<34}{s('chain_steps_per_s'):>40}"
        f"{s('celery_chain_per_s'):>40}{s('chain_ratio_vs_celery', '.2f'):>19}",
        f"  {fanout_label:<34}{s('fanout_steps_per_s'):>40}{s('celery_fanout_per_s'):>40}"
        f"{s('fanout_ratio_vs_celery', '.2f'):>19}",
        f"  {'chain step-to-step p50, ms':<34}{s('p50_ms', '.2f'):>40}"
        f"{s('celery_p50_ms', '.2f'):>40}{s('p50_ratio_vs_celery', '.2f'):>19}",
        f"  {'chain step-to-step p99, ms':<34}{s('p99_ms', '.2f'):>40}"
        f"{s('celery_p99_ms', '.2f'):>40}",
        f"  {'CPU % chain / fan-out':<34}"
        f"{s('cpu_onward_chain') + ' / ' + s('cpu_onward_fanout'):>40}"
        f"{s('cpu_celery_chain') + ' / ' + s('cpu_celery_fanout'):>40}",
        f"  {'worker CPU ms/step chain/fan-out':<34}"
        f"{pair('chain_cpu_ms_per_step', 'fanout_cpu_ms_per_step', '.2f'):>40}"
        f"{pair('celery_chain_cpu_ms_per_step', 'celery_fanout_cpu_ms_per_step', '.2f'):>40}",
        f"  {'  + PostgreSQL backends':<34}"
        f"{pair('chain_pg_cpu_ms_per_step', 'fanout_pg_cpu_ms_per_step', '.2f'):>40}",
        f"  {'onward handoff p50 / p99, ms':<34}"
        f"{s('handoff_p50_ms', '.2f') + ' / ' + s('handoff_p99_ms', '.2f'):>40}",
        f"  {'onward stale deliveries':<34}"
        f"{'chain ' + s('stale_chain') + ', fan-out ' + s('stale_fanout'):>40}",
        "",
        f"  bare durable tx ({meta['bare_clients']} client processes; UPDATE run + INSERT "
        f"checkpoint of 1 KB + INSERT outbox + COMMIT): {s('bare_tx_per_s')} tx/s, "
        f"p50 {s('bare_tx_p50_ms', '.2f')} ms, CPU {s('cpu_bare_tx')}%",
        f"  onward steps/s as a share of it: chain {s('chain_vs_bare_tx', '.2f')}, "
        f"fan-out {s('fanout_vs_bare_tx', '.2f')}",
    ]
    if "broker_chain_per_s" in series:
        lines += ["", "  onward with every step through the broker (ONWARD_EAGER_STEPS=0: no eager "
                  "continuation; own database, queue, processes)", *stack_lines(s, "broker")]
    if "variant_chain_per_s" in series:
        lines += ["", f"  A/B: onward variant `{meta['variant']}` (own database, queue, processes)",
                  *stack_lines(s, "variant")]
    if "celery_variant_chain_per_s" in series:
        lines += [
            f"  plain Celery variant `{meta['celery_variant']}`: chain "
            f"{s('celery_variant_chain_per_s')} ({s('celery_variant_chain_vs_celery', '.2f')} x "
            f"plain), fan-out {s('celery_variant_fanout_per_s')} "
            f"({s('celery_variant_fanout_vs_celery', '.2f')} x plain), p50 "
            f"{s('celery_variant_p50_ms', '.2f')} ms; worker CPU ms/step "
            f"{s('celery_variant_chain_cpu_ms_per_step', '.2f')} / "
            f"{s('celery_variant_fanout_cpu_ms_per_step', '.2f')}",
        ]
        if "variant_chain_vs_celery_variant" in series:
            lines.append(
                f"    onward variant vs plain Celery variant: chain "
                f"{s('variant_chain_vs_celery_variant', '.2f')}, fan-out "
                f"{s('variant_fanout_vs_celery_variant', '.2f')}")
    lines += [
        "",
        "  step-to-step = start of step k -> start of step k+1 of the chain (onward: "
        "step_attempts.started_at, the claim's now(); plain Celery: time.time() at task start)",
        "  handoff = onward step k's commit statement starts (ended_at) -> step k+1's claim "
        "starts (started_at)",
        "  stale delivery = a message whose claim found the run already past it (a duplicate)",
        "  worker CPU = user+system CPU of the worker process trees (onward: + dispatcher and "
        "reaper) per step; PostgreSQL backends = CPU of the server processes serving the "
        "side's database (local servers only). Less sensitive to other load than steps/s.",
        "",
        "  targets:",
    ]
    for label, ok in meta["targets"]:
        lines.append(f"    [{'PASS' if ok else 'MISS'}] {label}")
    lines.append("    (judged on onward's defaults, eager continuation on)")
    if "broker_chain_per_s" in series:
        lines.append(
            "    every step through the broker: fan-out "
            f"{s('broker_fanout_ratio_vs_celery', '.2f')}x, chain "
            f"{s('broker_chain_ratio_vs_celery', '.2f')}x, p50 "
            f"{s('broker_p50_ratio_vs_celery', '.2f')}x plain Celery's")
    print("\n".join(lines))


def profile_report(directory: Path, label: str, limit: int = 30) -> None:
    for role in ("child", "parent"):
        files = sorted(str(p) for p in directory.glob(f"{label}-{role}-*.prof"))
        if not files:
            log(f"profile: no {label} {role} profiles in {directory}")
            continue
        stats = pstats.Stats(*files, stream=sys.stderr)
        log(f"profile: {label} {role} ({len(files)} files), by tottime")
        stats.sort_stats("tottime").print_stats(limit)
        log(f"profile: {label} {role}, by cumulative")
        stats.sort_stats("cumulative").print_stats(limit)


# -- main ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON line on stdout")
    parser.add_argument("--chain-steps", type=int, default=2000)
    parser.add_argument("--fanout-runs", type=int, default=200)
    parser.add_argument("--fanout-steps", type=int, default=10)
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes (each `-c CONCURRENCY`) per side; default 1")
    parser.add_argument("--concurrency", "-c", type=int, default=2)
    parser.add_argument("--loglevel", default="WARNING",
                        help="log level of every process, both sides (Celery logs 2 lines "
                             "per task at INFO)")
    parser.add_argument("--broker", metavar="URL",
                        help="the broker every side uses, e.g. amqp://guest:guest@127.0.0.1:5672// "
                             "(default: ONWARD_BROKER_URL or the embedded Redis); plain Celery "
                             "on RabbitMQ uses classic queues without publisher confirms")
    parser.add_argument("--bare-clients", type=int, default=4)
    parser.add_argument("--bare-seconds", type=float, default=4.0)
    parser.add_argument("--variant", metavar="MODULE",
                        help="A/B: also run an onward stack whose processes are started as "
                             "`python -m MODULE worker|dispatcher|reaper ...` (a module that "
                             "patches something, then runs the onward CLI)")
    parser.add_argument("--variant-env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for the variant stack (e.g. "
                             "ONWARD_OUTBOX_GRACE_S=60); implies a variant stack")
    parser.add_argument("--variant-db-role", metavar="ROLE",
                        help="the variant stack's worker, dispatcher and reaper connect as ROLE "
                             "(e.g. onward_operator, so row-level security applies: the "
                             "configured superuser bypasses it); implies a variant stack")
    parser.add_argument("--broker-path", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure onward with ONWARD_EAGER_STEPS=0 (every step "
                             "through the broker), as its own stack; on by default")
    parser.add_argument("--celery-variant", metavar="FLAGS",
                        help="also run plain Celery with FLAGS: tuned and/or noevents or events, "
                             "comma-separated (see bench/plain_celery.py)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="run the workers under cProfile, write .prof files to DIR")
    parser.add_argument("--profile-clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the bench databases")
    return parser.parse_args(argv)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # clean up (processes, databases) on SIGTERM
    started = time.monotonic()
    base = WorkerSettings()
    admin_url = database_url(base)
    records = broker_url(base)  # a Redis: where plain Celery's tasks record start times
    if not records.startswith(("redis://", "rediss://")):
        records = broker_url(base.model_copy(update={"broker_url": None}))
    broker = args.broker or broker_url(base)
    home = base.home_dir
    token = secrets.token_hex(4)
    host = socket.gethostname()
    log(f"database server {redact(admin_url)}, broker {redact(broker)}")
    log_dir = Path(tempfile.mkdtemp(prefix="onward-bench-"))
    common_env = {"ONWARD_BROKER_URL": broker, "ONWARD_HOME": str(home),
                  "ONWARD_WORKFLOWS": WORKFLOW_MODULE, "BENCH_BROKER_URL": broker,
                  "BENCH_RECORDS_URL": records}
    procs = Processes(env=common_env, log_dir=log_dir)
    client = redis.Redis.from_url(records)
    on_redis = broker.startswith(("redis://", "rediss://"))
    broker_queues = Queues(client if on_redis else None,
                           None if on_redis else make_app(broker, "bench.probe", "default",
                                                          records))
    profile_env: dict[str, str] = {}
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        profile_env = {"BENCH_PROFILE_DIR": str(args.profile.resolve()),
                       "BENCH_PROFILE_CLOCK": args.profile_clock}
    variant_env = dict(kv.split("=", 1) for kv in args.variant_env)
    if (variant_env or args.variant_db_role) and not args.variant:
        args.variant = "console"
    stacks: list[OnwardStack] = []
    queues: list[str] = []
    ok = False
    try:
        shared: dict[str, Any] = {
            "admin_url": admin_url, "broker": broker, "home": home, "token": token,
            "procs": procs, "args": args, "profile_env": profile_env, "host": host,
            "stacks": stacks}
        main_stack, pending = start_onward("onward", "console", {}, **shared)
        if args.broker_path:
            _, more = start_onward("broker", "console", {"ONWARD_EAGER_STEPS": "0"}, **shared)
            pending += more
        if args.variant:
            _, more = start_onward("variant", args.variant, variant_env, **shared,
                                   db_role=args.variant_db_role)
            pending += more
        plain_shared: dict[str, Any] = {"token": token, "procs": procs, "args": args,
                                        "profile_env": profile_env, "host": host}
        plain_queue, more = start_plain("celery", "default", **plain_shared)
        pending += more
        plain_app = make_app(broker, plain_queue, "default", records)
        sides: dict[str, Callable[[int, int], Result]] = {}
        for stack in stacks:
            account = CpuAccount(stack.pids, stack.ledger.engine)
            sides[stack.name] = OnwardSide(stack.ledger, procs, account, broker_queues).run
        sides["celery"] = PlainSide(plain_app, client, plain_queue, procs,
                                    CpuAccount([p.pid for p, _ in more]), broker_queues).run
        queues = [s.queue for s in stacks] + [plain_queue]
        if args.celery_variant:
            queue, more = start_plain("celery_variant", args.celery_variant, **plain_shared)
            pending += more
            queues.append(queue)
            sides["celery_variant"] = PlainSide(make_app(broker, queue, args.celery_variant,
                                                         records),
                                                client, queue, procs,
                                                CpuAccount([p.pid for p, _ in more]),
                                                broker_queues).run
        conninfo = libpq_conninfo(main_stack.db_url)
        baretx.setup(conninfo)
        for proc, node in pending:
            wait_ready(plain_app, proc, node)
        log(f"workers ready: {', '.join(p.name for p, _ in pending)} (logs in {log_dir})")

        for name, run in sides.items():  # warm-up: connections, prepared statements, imports
            run(1, 50)
            run(40, 5)
            log(f"warm-up done: {name}")

        chains = [(f"{name}_chain", lambda run=run: run(1, args.chain_steps))
                  for name, run in sides.items()]
        fanouts = [(f"{name}_fanout", lambda run=run: run(args.fanout_runs, args.fanout_steps))
                   for name, run in sides.items()]

        def bare() -> Result:
            before = CpuMeter.sample()
            measured = baretx.measure(conninfo, args.bare_clients, args.bare_seconds)
            return Result(0, args.bare_seconds, [], [], CpuMeter.busy(before, CpuMeter.sample()),
                          measured)

        scenarios: list[tuple[str, Callable[[], Result]]] = [*chains, *fanouts, ("bare_tx", bare)]
        rounds: list[dict[str, Result]] = []
        for index in range(args.rounds):
            shift = index % len(scenarios)
            results: dict[str, Result] = {}
            for key, fn in scenarios[shift:] + scenarios[:shift]:
                time.sleep(0.5)
                result = fn()
                results[key] = result
                prefix = f"round {index + 1}/{args.rounds} {key:<22}"
                if key == "bare_tx":
                    d = result.detail
                    log(f"{prefix} {d['tx_per_s']:7.0f} tx/s  p50 {d['p50_ms']:.2f} ms  "
                        f"p99 {d['p99_ms']:.2f} ms  cpu {result.cpu or 0:.0f}%")
                    continue
                extra = ""
                if result.s2s_ms:
                    extra += (f"  s2s p50 {percentile(result.s2s_ms, 50):.2f} "
                              f"p99 {percentile(result.s2s_ms, 99):.2f} ms")
                if result.detail.get("stale_deliveries"):
                    extra += (f"  stale deliveries {result.detail['stale_deliveries']} "
                              f"({result.detail['leftover_messages']} still queued at the end)")
                log(f"{prefix} {result.steps} steps {result.seconds:6.2f} s "
                    f"{result.per_s:7.1f} steps/s  cpu {result.cpu or 0:.0f}%{extra}")
            rounds.append(results)

        series = summarize(rounds, list(sides))
        medians = {k: med(v) for k, v in series.items()}
        targets = [  # the project's floors (README, Performance)
            (f"fan-out >= 1.0x plain Celery: {medians['fanout_ratio_vs_celery']:.2f}x",
             medians["fanout_ratio_vs_celery"] >= 1.0),
            (f"chain >= 1.0x plain Celery: {medians['chain_ratio_vs_celery']:.2f}x",
             medians["chain_ratio_vs_celery"] >= 1.0),
            (f"step-to-step p50 <= plain Celery's: {medians['p50_ratio_vs_celery']:.2f}x",
             medians["p50_ratio_vs_celery"] <= 1.0),
        ]
        workers_desc = (f"{args.workers} x `onward worker -c {args.concurrency}` (prefork: "
                        f"{args.workers * args.concurrency} worker child processes) + "
                        "`onward dispatcher` + `onward reaper`; plain Celery: "
                        f"{args.workers} x the same worker command line")
        onward_settings = WorkerSettings.of(main_stack.ledger.settings)
        ack = onward_settings.broker_ack_emulation
        events = ("-E (task events on)" if WorkerSettings().task_events
                  else "task events off (ONWARD_TASK_EVENTS, the default)")
        settings_desc = (f"prefork -c {args.concurrency}, {events}, no gossip/mingle, "
                         f"acks_late, prefetch 1, json, results ignored, loglevel "
                         f"{args.loglevel}; onward: ack emulation {'on' if ack else 'off'}, "
                         f"eager continuation up to {onward_settings.eager_steps} steps / "
                         f"{onward_settings.eager_window_ms:.0f} ms per message (the defaults); "
                         "plain Celery: stock kombu Redis transport (ack emulation on)")
        meta = {
            "workers_desc": workers_desc, "settings_desc": settings_desc,
            "database": redact(admin_url), "db_name": main_stack.db_name,
            "broker": redact(broker), "queues": ", ".join(queues), "rounds": args.rounds,
            "chain_steps": args.chain_steps, "fanout_runs": args.fanout_runs,
            "fanout_steps": args.fanout_steps, "bare_clients": args.bare_clients,
            "targets": targets, "celery_variant": args.celery_variant,
            "variant": " ".join([args.variant or "", *args.variant_env,
                                 *([f"db_role={args.variant_db_role}"]
                                   if args.variant_db_role else [])]).strip(),
        }
        if args.json:
            out: dict[str, Any] = {k: (round(v, 3) if v == v else None)
                                   for k, v in medians.items()}
            out.update({
                "rounds": args.rounds,
                "per_round": {k: [round(x, 3) if x is not None and x == x else None
                                  for x in v] for k, v in series.items()},
                "workers": args.workers, "concurrency": args.concurrency,
                "worker_mode": workers_desc, "settings": settings_desc,
                "variant": meta["variant"] or None, "celery_variant": args.celery_variant,
                "latency_definition": "chain: start of step k -> start of step k+1 (onward: "
                                      "step_attempts.started_at; plain Celery: task start)",
                "targets_met": {"fanout_1.0x": targets[0][1], "chain_1.0x": targets[1][1],
                                "p50_1.0x": targets[2][1]},
                "seconds": round(time.monotonic() - started, 1),
            })
            print(json.dumps(out), flush=True)
        else:
            print_table(series, meta)
        ok = True
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second ^C must not skip the cleanup
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log("stopping processes")
        procs.stop_all()
        for queue in queues:
            client.delete(*record_keys(queue))
            broker_queues.delete(queue)
        for stack in stacks:
            stack.ledger.engine.dispose()
            if args.keep_db:
                log(f"kept database {stack.db_name}")
            else:
                drop_database(admin_url, stack.db_name)
        if not ok:
            log(f"failed; process logs are in {log_dir}")
    if args.profile:
        profile_report(args.profile, "onward")
    log(f"done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
