"""The bench's options: how many runs, how much chaos of each kind, which servers."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import bench.chaos

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

    @property
    def tool_timeout_s(self) -> float:
        """A provider call's time limit (ONWARD_TOOL_TIMEOUT_S): a long call outlives the
        lease TTL, not the call's own limit, and a killed holder's extended lease (limit +
        ONWARD_TOOL_LEASE_MARGIN_S) expires within seconds, as the bench's other timings."""
        return self.long_call_s + 2.0


def config_of(a: argparse.Namespace) -> Config:
    """The bench's configuration; counts not given scale with the chaos window."""
    window = a.window if a.window is not None else max(60.0, a.runs * a.steps * 0.1)
    settle = a.settle if a.settle is not None else max(150.0, window * 0.3)

    def scaled(name: str, minimum: int = 0) -> int:
        given = getattr(a, name)
        if given is not None:
            return int(given)
        count: int = max(minimum, round(PER_MINUTE[name] * window / 60.0))
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.chaos",
                                description=(bench.chaos.__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", "-R", type=int, default=40)
    p.add_argument("--steps", "-K", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    _timing_args(p)
    _chaos_args(p)
    _server_args(p)
    p.add_argument("--keep", action="store_true", help="keep the database and the work dir")
    p.add_argument("--json", action="store_true", help="quiet stderr; the JSON line is always "
                                                       "printed on stdout")
    return p.parse_args(argv)


def _timing_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--window", type=float, default=None,
                   help="seconds of chaos (runs are started during the first 70%%); default: "
                        "60 or 0.1 s per step of work (runs x steps), whichever is longer")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds after the window to wait for every run to settle; default: "
                        "150 or 30%% of the window, whichever is longer")
    p.add_argument("--pause-ms", type=int, default=300,
                   help="time each step spends around its effect (must stay under the lease)")
    p.add_argument("--lease-ttl", type=float, default=3.0)


def _per_minute(name: str) -> str:
    at_most = f", at most {DEFAULT_AT_MOST[name]}" if name in DEFAULT_AT_MOST else ""
    return f" (default: {PER_MINUTE[name]} per minute of window{at_most})"


def _chaos_args(p: argparse.ArgumentParser) -> None:
    _process_chaos_args(p)
    _outage_args(p)
    p.add_argument("--pauses", type=int, default=0,
                   help="SIGSTOP a lease holder; SIGCONT it once another worker has taken "
                        "over and committed its step (30 s at most): a stale holder resuming")
    p.add_argument("--stop-point", action="store_true",
                   help="also restart a worker with after_effect_pending:stop:once (the child "
                        "stops itself between recording the intent and calling the provider; "
                        "continued like --pauses); uses one of the --tree-kills restarts")


def _process_chaos_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--child-kills", type=int, default=None,
                   help="SIGKILLs of a pool child" + _per_minute("child_kills"))
    p.add_argument("--tree-kills", type=int, default=None,
                   help="whole-worker kills; the 5 named worker points are armed, round-robin, "
                        "on the workers restarted after them" + _per_minute("tree_kills"))
    p.add_argument("--dispatcher-kills", type=int, default=None,
                   help="the first restarts with dispatcher_after_publish_before_mark armed"
                        + _per_minute("dispatcher_kills"))
    p.add_argument("--dispatchers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=None,
                   help="pool children per worker (2 workers); default: 2, or 4 when runs x "
                        f"steps is above {BIG_BATCH_STEPS}")
    p.add_argument("--backend-kills", type=int, default=None,
                   help="pg_terminate_backend of a worker's or dispatcher's connection"
                        + _per_minute("backend_kills"))


def _outage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--blind-runs", type=int, default=2,
                   help="runs with one write through a tool without lookup whose response "
                        "the provider drops: they must park (expected_parked)")
    p.add_argument("--drop-waves", type=int, default=None,
                   help="provider drops a response" + _per_minute("drop_waves"))
    p.add_argument("--error-waves", type=int, default=None,
                   help="provider answers 500" + _per_minute("error_waves"))
    p.add_argument("--pg-restarts", type=int, default=None,
                   help="PostgreSQL crashes and restarts, on a private server (0: use the "
                        "configured server, never restarted; at least 1 by default)"
                        + _per_minute("pg_restarts"))
    p.add_argument("--long-calls", type=int, default=None,
                   help="creates the provider holds --long-call-s before acting"
                        + _per_minute("long_calls"))
    p.add_argument("--long-call-s", type=float, default=None,
                   help="how long a long call is held (default: the lease TTL + 1 s); the "
                        "tools' time limit is 2 s more")
    p.add_argument("--no-flush", action="store_true", help="do not FLUSHDB the broker")
    p.add_argument("--no-async", action="store_true", help="no asynchronous-completion period")
    p.add_argument("--key-ttl", type=float, default=0.2,
                   help="provider idempotency-key retention, seconds (short: resends would "
                        "duplicate)")


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker-db", type=int, default=None,
                   help="Redis DB number for the broker (it is flushed once!); default: the "
                        "first empty one in 1..14; -1: the configured URL as is")
