"""Agent-shaped load: R runs x K steps, each step one model call (one in three also a write to
the reference provider), on one worker pool, next to plain Celery making the same HTTP calls
with the same pool and concurrency (no durability), in the same run.

    python bench/agents.py                       # gevent -c 500, 5 s model latency, ~3 min
    python bench/agents.py --pool threads -c 64 --latency-ms 500 --runs 200
    python bench/agents.py --json                # one JSON line on stdout
    python bench/agents.py --async --pool threads -c 500   # async def steps (below)

The model server (examples/model_server.py) and the provider (examples/provider.py) are real
HTTP services on loopback, started here; so are onward's worker(s), dispatcher and reaper,
and the plain Celery worker (bench/plain_agents.py), against a database of the bench's own
on the configured PostgreSQL and a queue of its own on the configured Redis.

``--async`` runs bench/agent_flow_async.py instead: the same agent with ``async def`` steps
awaiting ``AsyncOpenAIChat`` (``openai.AsyncOpenAI``) and an async provider tool on each
worker process's event loop (tasks/aio.py); the plain Celery side then hands the same awaited
calls to an event loop thread of its own from each task (bench/plain_agents.py). Not with
``--pool gevent`` (onward refuses async steps there).

Both sides build one model client per worker process and spread its calls over
``--model-clients`` SDK clients (connection pools; default one per 50 of ``-c``):
``OpenAIChat(clients=N)``, tasks/llm_openai.py says why.

Phases: onward (unlimited model), plain Celery (unlimited model), then onward against a
model with a quota (--quota-concurrency / --quota-rate, 20 and 100/s by default) whose client
declares the same quota as a fleet-wide limit (docs/limits.md): the workers keep inside it
(no 429), and a step that finds it full waits without a worker until a slot frees.

Fields (JSON): inflight_max / inflight_avg (requests the model server held at once: peak,
and time-weighted mean over its busy time), steps_per_s, celery_steps_per_s,
ratio_vs_celery, ideal_steps_per_s (concurrency / latency, or runs / latency when fewer runs
than slots), worker_rss_mb (peak resident memory of the onward worker processes),
cpu_ms_per_step (their CPU per committed step), overhead_p50_ms / overhead_p99_ms (a step's
committed attempt, claim to commit by the database's clock, minus the time the model server
held its request, which is deterministic; the provider write of one step in three counts as
overhead), model_late_p50_ms / model_late_max_ms (how much longer than that latency the
model server itself took to answer, from taking a request to sending the answer: its event
loop's lag on a busy machine, which the overhead includes though it is not the worker's),
model_429s, model_max_concurrency, model_limit_concurrency and throttled_fleet_cpu_s (quota
phase: worker CPU seconds spent on attempts that did not commit (throttled re-checks: a
claim, the step up to its call, a deferral; 429s), estimated as the phase's worker CPU
times their share of attempts; a step waiting for a slot holds no worker and costs none).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from workers.settings import WorkerSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil
import redis
import sqlalchemy as sa

from bench.agent_flow import MODEL, QUOTA_WORKFLOW, WORKFLOW, messages_for
from bench.agent_flow_async import ASYNC_QUOTA_WORKFLOW, ASYNC_WORKFLOW
from bench.plain_agents import TASK, done_key
from bench.plain_agents import make_app as plain_app
from examples.model_server import answer_for, hold_s
from harness.databases import create_database, drop_database
from harness.errors import HarnessError as BenchFailed
from harness.model_server import ModelServer
from harness.processes import Proc, Processes
from harness.processes import wait_answers_ping as wait_ready
from harness.provider import ReferenceProvider
from ledger import Ledger
from ledger.db import database_url
from tasks.workflow import Registry
from workers.app import create_app
from workers.broker import broker_url


def log(message: str) -> None:
    print(f"[agents {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- measuring processes -------------------------------------------------------------------
@dataclass
class Sampler:
    """Peak RSS and CPU of some process trees, sampled in the background."""

    procs: list[Proc]
    peak_rss: float = 0.0
    stopping: threading.Event = field(default_factory=threading.Event)

    def _tree(self) -> list[psutil.Process]:
        found = []
        for proc in self.procs:
            try:
                root = psutil.Process(proc.pid)
                found += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        return found

    def rss(self) -> float:
        total = 0
        for process in self._tree():
            try:
                total += process.memory_info().rss
            except psutil.Error:
                continue
        return total / 1e6

    def cpu(self) -> float:
        total = 0.0
        for process in self._tree():
            try:
                times = process.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                continue
        return total

    def __enter__(self) -> Sampler:
        self.peak_rss = self.rss()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.stopping.wait(0.5):
            self.peak_rss = max(self.peak_rss, self.rss())

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()


# -- the phases ----------------------------------------------------------------------------
@dataclass
class Phase:
    steps: int
    seconds: float
    model: dict[str, Any]
    rss_mb: float
    cpu_s: float
    attempts: int = 0
    failed_attempts: int = 0
    overheads_ms: list[float] = field(default_factory=list)

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0


def onward_phase(ledger: Ledger, model: ModelServer, workers: list[Proc], runs: int, steps: int,
                 deadline_s: float, procs: Processes, limits: dict[str, Any],
                 latency: tuple[float, float], workflow: str = WORKFLOW) -> Phase:
    model.reset()
    model.configure(**limits)
    with Sampler(workers) as sampler:
        cpu0 = sampler.cpu()
        with ledger.engine.begin() as conn:
            t0 = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
            ids = [ledger.start_run_txn(conn, workflow, {"topic": f"t{i}", "steps": steps})
                   for i in range(runs)]
        _wait_runs(ledger, ids, deadline_s, procs)
        cpu = sampler.cpu() - cpu0
    with ledger.engine.connect() as conn:
        seconds = float(conn.execute(sa.text(
            "SELECT extract(epoch FROM max(finished_at) - :t0) FROM onward.runs "
            "WHERE id = ANY(:ids)"), {"t0": t0, "ids": ids}).scalar_one())
        attempts = conn.execute(sa.text(
            "SELECT a.run_id, a.seq, a.outcome, 1000 * extract(epoch FROM a.ended_at - "
            "a.started_at) AS ms, r.result FROM onward.step_attempts a JOIN onward.runs r "
            "ON r.id = a.run_id WHERE a.run_id = ANY(:ids)"), {"ids": ids}).mappings().all()
    topics = {run_id: f"t{i}" for i, run_id in enumerate(ids)}
    overheads = [float(a["ms"]) - 1000 * model_hold_s(topics[a["run_id"]], a["seq"], latency)
                 for a in attempts if a["outcome"] == "committed"]
    return Phase(runs * steps, seconds, model.stats(), sampler.peak_rss, cpu,
                 attempts=len(attempts),
                 failed_attempts=sum(a["outcome"] != "committed" for a in attempts),
                 overheads_ms=overheads)


def model_hold_s(topic: str, seq: int, latency: tuple[float, float]) -> float:
    """What the model server held step ``seq`` of the run on ``topic`` (its latency)."""
    answer = answer_for(MODEL, messages_for(topic, seq), None)
    return hold_s(answer["id"], *latency)


def _wait_runs(ledger: Ledger, ids: list[Any], deadline_s: float, procs: Processes) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        with ledger.engine.connect() as conn:
            left = conn.execute(sa.text(
                "SELECT count(*) FROM onward.runs WHERE id = ANY(:ids) AND status IN "
                "('running', 'waiting')"), {"ids": ids}).scalar_one()
        if left == 0:
            return
        procs.check_alive()
        if time.monotonic() > deadline:
            raise BenchFailed(f"{left} of {len(ids)} runs still running after {deadline_s:.0f}s")
        time.sleep(0.5)


def celery_phase(app: Any, client: redis.Redis, queue: str, model: ModelServer, workers: list[Proc],
                 runs: int, steps: int, deadline_s: float, procs: Processes) -> Phase:
    model.reset()
    model.configure(max_concurrency=0, rate_per_s=0)
    client.delete(done_key(queue))
    with Sampler(workers) as sampler:
        cpu0 = sampler.cpu()
        t0 = time.time()
        with app.producer_pool.acquire(block=True) as producer:
            for i in range(runs):
                app.send_task(TASK, kwargs={"run": f"p{i}-{secrets.token_hex(3)}", "n": 0,
                                            "steps": steps}, queue=queue, producer=producer)
        deadline = time.monotonic() + deadline_s
        while client.llen(done_key(queue)) < runs:
            procs.check_alive()
            if time.monotonic() > deadline:
                raise BenchFailed("plain Celery chains did not finish in time")
            time.sleep(0.2)
        cpu = sampler.cpu() - cpu0
    records = [r.decode().split()
               for r in cast(list[bytes], client.lrange(done_key(queue), 0, -1))]
    finished = max(float(r[1]) for r in records)
    lost = [r for r in records if r[2] == "lost"]
    done_steps = runs * steps - sum(steps - int(r[3]) for r in lost)
    phase = Phase(done_steps, finished - t0, model.stats(), sampler.peak_rss, cpu)
    phase.failed_attempts = len(lost)
    return phase


# -- the run -------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=5000.0)
    parser.add_argument("--jitter", type=float, default=0.2)
    parser.add_argument("--pool", default="gevent", choices=["prefork", "threads", "gevent"])
    parser.add_argument("--concurrency", "-c", type=int, default=500)
    parser.add_argument("--workers", type=int, default=1, help="worker processes per side")
    parser.add_argument("--quota-runs", type=int, default=40, help="0 skips the quota phase")
    parser.add_argument("--quota-concurrency", type=int, default=20)
    parser.add_argument("--quota-rate", type=float, default=100.0)
    parser.add_argument("--async", dest="use_async", action="store_true",
                        help="async def steps on the worker's event loop (not with gevent)")
    parser.add_argument("--model-clients", type=int, default=0,
                        help="SDK clients (connection pools) per worker process, both sides; "
                        "0: one per 50 of -c")
    parser.add_argument("--skip-celery", action="store_true")
    parser.add_argument("--deadline", type=float, default=240.0, help="seconds per phase")
    parser.add_argument("--loglevel", default="WARNING")
    parser.add_argument("--json", action="store_true", help="print one JSON line on stdout")
    parser.add_argument("--keep-db", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.use_async and args.pool == "gevent":
        raise SystemExit("--async runs async def steps, which the gevent pool cannot host "
                         "(docs/steps.md, \"Async steps\"): use --pool threads or prefork")
    began = time.monotonic()
    load = os.getloadavg()
    settings = WorkerSettings()
    admin_url, broker = database_url(settings), broker_url(settings)
    db_name, db_url = create_database(admin_url, "onward_agents")
    work = Path(tempfile.mkdtemp(prefix="onward-agents-"))
    queue = f"bench.agents.{secrets.token_hex(4)}"
    env = {"ONWARD_DATABASE_URL": db_url, "ONWARD_BROKER_URL": broker, "ONWARD_QUEUE": queue,
           "ONWARD_WORKFLOWS": "bench.agent_flow_async" if args.use_async
           else "bench.agent_flow", "ONWARD_LOG_LEVEL": args.loglevel,
           "ONWARD_CHECKPOINT_KEY": secrets.token_hex(16), "ONWARD_RETRY_MAX_S": "5",
           "ONWARD_LEASE_TTL_S": str(max(30.0, 4 * args.latency_ms / 1000)),
           "ONWARD_HOME": str(work), "ONWARD_AUTH": "off"}
    procs = Processes(log_dir=work, env=env)
    try:
        result = _measure(args, procs, env, queue, broker)
    finally:
        procs.stop_all()
        if not args.keep_db:
            drop_database(admin_url, db_name)
    result.update(load_avg_1m_at_start=round(load[0], 2), seconds=round(
        time.monotonic() - began, 1), logs=str(work))
    _report(result, args.json)
    return 0


def model_clients(args: argparse.Namespace) -> int:
    """SDK clients per worker process (``--model-clients``, else one per 50 slots)."""
    return int(args.model_clients or max(1, math.ceil(args.concurrency / 50)))


def _measure(args: argparse.Namespace, procs: Processes, env: dict[str, str], queue: str,
             broker: str) -> dict[str, Any]:
    work = procs.log_dir
    model = ModelServer.start(procs, work, "--latency-ms", str(args.latency_ms), "--jitter",
                              str(args.jitter))
    provider = ReferenceProvider.start(procs, work)
    procs.env.update(ONWARD_MODEL_URL=model.url, ONWARD_EXAMPLE_PROVIDER_URL=provider.url,
                     BENCH_QUOTA_CONCURRENCY=str(args.quota_concurrency),
                     BENCH_QUOTA_RATE=str(args.quota_rate),
                     BENCH_MODEL_CLIENTS=str(model_clients(args)))
    given: dict[str, Any] = {k.removeprefix("ONWARD_").lower(): v for k, v in procs.env.items()
                             if k in ("ONWARD_DATABASE_URL", "ONWARD_BROKER_URL",
                                      "ONWARD_QUEUE", "ONWARD_CHECKPOINT_KEY")}
    settings = WorkerSettings(**given)
    ledger = Ledger.from_env(settings)
    procs.start("dispatcher", ["-m", "console", "dispatcher"])
    procs.start("reaper", ["-m", "console", "reaper"])
    onward_app = create_app(settings, registry=Registry())
    run_tag = queue.rsplit(".", 1)[-1]  # in node names: a ping reaches every worker on the
    # broker, and another bench's "agents-0@bench" would answer for one not started yet
    workers = []
    for index in range(args.workers):
        node = f"agents-{index}-{run_tag}@bench"
        workers.append(procs.start(node, ["-m", "console", "worker", "-P", args.pool, "-c",
                                          str(args.concurrency), "--name", node]))
        wait_ready(onward_app, workers[-1], node)
    plain_queue = f"{queue}.plain"
    plain = [procs.start(f"plain-{i}", ["-m", "bench.plain_agents"], {
        "BENCH_BROKER_URL": broker, "BENCH_PLAIN_QUEUE": plain_queue, "BENCH_POOL": args.pool,
        "BENCH_CONCURRENCY": str(args.concurrency), "BENCH_NODE": f"plain-{i}-{run_tag}@bench",
        "BENCH_LOGLEVEL": args.loglevel, "BENCH_ASYNC": "1" if args.use_async else "0"})
        for i in range(0 if args.skip_celery else args.workers)]
    papp = plain_app(broker, plain_queue)
    for i, proc in enumerate(plain):
        wait_ready(papp, proc, f"plain-{i}-{run_tag}@bench")
    log(f"{args.workers} x {args.pool} -c {args.concurrency} per side"
        f"{', async steps' if args.use_async else ''}; model {args.latency_ms:g} "
        f"ms; {args.runs} runs x {args.steps} steps")

    latency = (args.latency_ms, args.jitter)
    workflow, quota_workflow = ((ASYNC_WORKFLOW, ASYNC_QUOTA_WORKFLOW) if args.use_async
                                else (WORKFLOW, QUOTA_WORKFLOW))
    onward = onward_phase(ledger, model, workers, args.runs, args.steps, args.deadline, procs,
                          {"max_concurrency": 0, "rate_per_s": 0}, latency, workflow)
    log(f"onward: {onward.steps_per_s:.1f} steps/s, model in flight max "
        f"{onward.model['max_inflight']} avg {onward.model['inflight_avg']}")
    celery = None
    if plain:
        client = redis.Redis.from_url(broker)
        celery = celery_phase(papp, client, plain_queue, model, plain, args.runs, args.steps,
                              args.deadline, procs)
        log(f"plain Celery: {celery.steps_per_s:.1f} steps/s, model in flight max "
            f"{celery.model['max_inflight']}")
    quota = None
    if args.quota_runs:
        quota = onward_phase(ledger, model, workers, args.quota_runs, args.steps, args.deadline,
                             procs, {"max_concurrency": args.quota_concurrency,
                                     "rate_per_s": args.quota_rate}, latency, quota_workflow)
        log(f"quota phase: {quota.model['rejected_429']} 429s, max in flight "
            f"{quota.model['max_inflight']}, {quota.failed_attempts} of {quota.attempts} "
            "attempts did not commit (throttled or retried)")
    return _fields(args, onward, celery, quota)


def _fields(args: argparse.Namespace, onward: Phase, celery: Phase | None,
            quota: Phase | None) -> dict[str, Any]:
    slots = args.workers * args.concurrency
    ideal = min(slots, args.runs) / (args.latency_ms / 1000)
    fields: dict[str, Any] = {
        "inflight_max": onward.model["max_inflight"],
        "inflight_avg": onward.model["inflight_avg"],
        "steps_per_s": round(onward.steps_per_s, 2),
        "celery_steps_per_s": round(celery.steps_per_s, 2) if celery else None,
        "ratio_vs_celery": round(onward.steps_per_s / celery.steps_per_s, 3) if celery else None,
        "ideal_steps_per_s": round(ideal, 2),
        "worker_rss_mb": round(onward.rss_mb, 1),
        "cpu_ms_per_step": round(1000 * onward.cpu_s / onward.steps, 2),
        "overhead_p50_ms": round(percentile(onward.overheads_ms, 0.5), 2),
        "overhead_p99_ms": round(percentile(onward.overheads_ms, 0.99), 2),
        "overhead_mean_ms": round(statistics.fmean(onward.overheads_ms), 2)
        if onward.overheads_ms else None,
        "model_late_p50_ms": onward.model.get("late_p50_ms"),
        "model_late_max_ms": onward.model.get("late_max_ms"),
        "celery_inflight_max": celery.model["max_inflight"] if celery else None,
        "celery_lost_chains": celery.failed_attempts if celery else None,
        "celery_worker_rss_mb": round(celery.rss_mb, 1) if celery else None,
        "celery_cpu_ms_per_step": round(1000 * celery.cpu_s / celery.steps, 2) if celery
        else None,
        "model_429s": quota.model["rejected_429"] if quota else None,
        "model_max_concurrency": quota.model["max_inflight"] if quota else None,
        "model_limit_concurrency": args.quota_concurrency if quota else None,
        "model_limit_rate_per_s": args.quota_rate if quota else None,
        "throttled_fleet_cpu_s": round(quota.cpu_s * quota.failed_attempts / quota.attempts, 2)
        if quota and quota.attempts else None,
        "quota_steps_per_s": round(quota.steps_per_s, 2) if quota else None,
        "quota_throttled_attempts": quota.failed_attempts if quota else None,
        "quota_note": "the client declares the server's quota as a fleet-wide limit "
        "(docs/limits.md): steps that find it full wait without a worker, woken when a "
        "slot frees; each such wait costs one claim and one deferral",
        "pool": args.pool, "async_steps": args.use_async, "concurrency": args.concurrency,
        "model_clients": model_clients(args),
        "workers": args.workers,
        "runs": args.runs, "steps": args.steps, "latency_ms": args.latency_ms,
    }
    fields["targets_met"] = {
        "inflight_500": fields["inflight_max"] >= 500,
        "rss_1.5gb": fields["worker_rss_mb"] <= 1500,
        "ratio_0.9": celery is not None and fields["ratio_vs_celery"] >= 0.9,
        "overhead_p50_5ms": fields["overhead_p50_ms"] <= 5,
        "no_429": quota is not None and fields["model_429s"] == 0,
    }
    return fields


def _report(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result), flush=True)
        return
    width = max(map(len, result))
    for name, value in result.items():
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    sys.exit(main())
