"""One chaos run: set up, follow the seeded plan while the runs go on, wait for every run
to settle, count, tear down."""

from __future__ import annotations

import contextlib
import heapq
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import sqlalchemy as sa

from bench.chaos import kills, outages, pauses, runs
from bench.chaos.count import count
from bench.chaos.fleet import Fleet
from bench.chaos.log import log
from bench.chaos.plan import Item, make_plan
from bench.chaos.state import Chaos
from harness.errors import HarnessError
from harness.waiting import wait_for
from ledger.exceptions import LedgerUnavailable

DB_ERRORS = (sa.exc.DBAPIError, psycopg.Error, LedgerUnavailable)
T = TypeVar("T")

ACTIONS: dict[str, Callable[[Chaos, Any], None]] = {
    "start_runs": runs.start_runs,
    "kill_child": lambda c, arg: kills.kill_child(c, arg or 0),
    "kill_tree": kills.kill_tree,
    "pause_holder": lambda c, arg: pauses.pause_holder(c, arg or 0),
    "restart_worker": kills.restart_worker,
    "kill_dispatcher": kills.kill_dispatcher,
    "restart_dispatcher": kills.restart_dispatcher,
    "restart_reaper": kills.restart_reaper,
    "flush_broker": lambda c, _arg: outages.flush_broker(c),
    "provider_drop": lambda c, n: outages.provider_fault(c, "provider_drop", n),
    "provider_500": lambda c, n: outages.provider_fault(c, "provider_500", n),
    "provider_async": outages.provider_async,
    "provider_slow": outages.provider_slow,
    "restart_postgres": lambda c, _arg: outages.restart_postgres(c),
    "start_postgres": lambda c, _arg: outages.start_postgres(c),
    "kill_backend": outages.kill_backend,
}


def run(c: Chaos) -> dict[str, Any]:
    started = time.monotonic()
    setup(c)
    plan_runs(c)
    settled = follow_plan(c)
    tolerant(c, runs.progress)
    time.sleep(1.0)  # let reconcile and polls that are still in flight land before counting
    report = count(c, settled)
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    report["chaos_s"] = round(c.now(), 1)
    return report


def setup(c: Chaos) -> None:
    cfg = c.cfg
    c.servers.start()
    c.fleet = Fleet(c.servers.env(), c.workdir / "logs", c.workdir / "faults",
                    concurrency=cfg.concurrency)
    for slot in range(cfg.dispatchers):
        c.fleet.dispatcher(slot)
    c.fleet.reaper()
    for slot in range(2):
        c.fleet.worker(slot)
    wait_for(lambda: _fleet_ready(c), timeout=180, what="2 workers to be ready",
             interval=0.2, seen=lambda: [m.proc.tail(2000) for m in c.fleet.live("worker")])
    log(f"fleet ready: 2 workers x {cfg.concurrency} children, "
        f"{cfg.dispatchers} dispatchers, 1 reaper; lease {cfg.lease_ttl_s}s")


def _fleet_ready(c: Chaos) -> bool:
    for member in c.fleet.all:
        if not member.alive():
            raise HarnessError(f"{member.name} exited ({member.proc.popen.returncode}) "
                               f"while starting:\n{member.proc.tail()}")
    return len(c.fleet.workers_ready()) >= 2


def plan_runs(c: Chaos) -> None:
    """Which runs write blind (and at which step), then the seeded schedule."""
    cfg = c.cfg
    indices = list(range(cfg.runs))
    c.rng.shuffle(indices)
    c.blind_plan = {i: c.rng.randrange(cfg.steps)
                    for i in indices[:min(cfg.blind_runs, cfg.runs)]}
    plan = make_plan(cfg, c.rng)
    c.heap = list(plan)
    heapq.heapify(c.heap)
    log(f"plan (seed {cfg.seed}): " + ", ".join(
        f"{k} x{n}" for k, n in Counter(i.kind for i in plan).items()))


def follow_plan(c: Chaos) -> bool:
    """Do each planned action when due until every run is settled (True) or the deadline
    passes (False)."""
    c.t0 = time.monotonic()
    last_progress = 0.0
    deadline = c.cfg.window_s + c.cfg.settle_s
    while True:
        now = c.now()
        counts = None
        tick(c, now)
        if now - last_progress >= 5.0:
            last_progress = now
            counts = tolerant(c, runs.progress)
        if settled(c, now, counts):
            return True
        if now > deadline:
            log(f"t={now:5.1f}s DEADLINE: not settled after {deadline:.0f}s", always=True)
            return False
        time.sleep(0.1)


def tick(c: Chaos, now: float) -> None:
    outages.poll_postgres(c)
    tolerant(c, pauses.continue_stopped)
    while c.heap and c.heap[0].at <= now:
        run_item(c, heapq.heappop(c.heap))
    kills.check_processes(c)


def settled(c: Chaos, now: float, counts: dict[str, int] | None) -> bool:
    """The chaos is over (nothing planned, stopped or down; every run started), at least
    half the window has passed, and no run is running."""
    chaos_over = (not c.heap and not c.stopped and not c.db_is_down(0.0)
                  and len(c.run_ids) == c.cfg.runs)
    if not chaos_over or now < c.cfg.window_s * 0.5:
        return False
    counts = counts or tolerant(c, runs.status_counts)
    return counts is not None and counts.get("running", 0) == 0


def run_item(c: Chaos, item: Item) -> None:
    """Do one planned action; one that failed on the database (down, restarting, its
    connection terminated) is tried again shortly, so no run wave or kill is lost."""
    try:
        ACTIONS[item.kind](c, item.arg)
    except Exception as exc:
        retry = (isinstance(exc, DB_ERRORS) or c.db_is_down()) and item.retries < 120
        log(f"t={c.now():5.1f}s action {item.kind} failed: {exc!r}"
            + ("; trying again in 0.5 s" if retry else ""), always=not retry)
        c.tally.events[f"{item.kind}_{'retried' if retry else 'failed'}"] += 1
        if retry:
            c.schedule(0.5, item.kind, item.arg, item.retries + 1)


def tolerant(c: Chaos, read: Callable[[Chaos], T]) -> T | None:
    """``read(c)``, or None when the database does not answer right now."""
    try:
        return read(c)
    except DB_ERRORS as exc:
        log(f"t={c.now():5.1f}s database read failed ({type(exc).__name__}); next time")
        return None


def teardown(c: Chaos, keep_db: bool) -> None:
    if c.pg_starting is not None:  # a start still under way: let it end first
        c.pg_starting.thread.join(timeout=70)
    if hasattr(c, "fleet"):
        with contextlib.suppress(Exception):
            c.fleet.stop_all()
    c.servers.stop(keep_db)
