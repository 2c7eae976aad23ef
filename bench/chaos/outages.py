"""Chaos outside the workers: the broker flushed, the provider misbehaving or slow,
PostgreSQL crashed and restarted, database connections terminated."""

from __future__ import annotations

import threading

import sqlalchemy as sa

from bench.chaos.agent import COLLECTION
from bench.chaos.fleet import APP_PREFIX
from bench.chaos.log import log
from bench.chaos.state import Chaos, Starting


def flush_broker(c: Chaos) -> None:
    keys, queued = c.servers.flush_broker()
    c.tally.events["broker_flushes"] += 1
    log(f"t={c.now():5.1f}s FLUSHDB {c.servers.broker} ({keys} keys, {queued} queued "
        "step messages gone)")


def provider_fault(c: Chaos, kind: str, count: int) -> None:
    fault = "drop_response" if kind == "provider_drop" else "error_500"
    c.servers.provider.arm(COLLECTION, **{fault: count})
    c.tally.events[f"armed_{fault}"] += count
    log(f"t={c.now():5.1f}s provider: next {count} creates in {COLLECTION!r}: {fault}")


def provider_async(c: Chaos, seconds: float) -> None:
    c.servers.provider.configure(async_complete_s=seconds)
    log(f"t={c.now():5.1f}s provider: async_complete_s={seconds}")


def provider_slow(c: Chaos, count: int) -> None:
    """The next ``count`` creates wait past the lease before the provider acts."""
    c.servers.provider.arm(COLLECTION, slow=count, slow_s=c.cfg.long_call_s)
    c.tally.events["armed_slow"] += count
    log(f"t={c.now():5.1f}s provider: next {count} creates in {COLLECTION!r} held "
        f"{c.cfg.long_call_s:.1f}s before acting (lease {c.cfg.lease_ttl_s}s)")


def restart_postgres(c: Chaos) -> None:
    """Crash our own PostgreSQL (``immediate``: no checkpoint, WAL recovery on start) and
    start it again a little later."""
    pg = c.servers.pg
    if pg is None:
        return
    if c.db_is_down():  # down, or back less than 10 s ago: one outage at a time
        c.schedule(5.0, "restart_postgres")
        return
    pg.stop("immediate")
    c.db_down = (c.now(), None)
    delay = c.rng.uniform(0.5, 3.0)
    log(f"t={c.now():5.1f}s PostgreSQL stopped (immediate); start in {delay:.1f}s")
    c.schedule(delay, "start_postgres")


def start_postgres(c: Chaos) -> None:
    """Start it in the background (crash recovery takes seconds on a busy machine, and the
    chaos goes on meanwhile); poll_postgres() notices when it is up."""
    pg = c.servers.pg
    assert pg is not None
    starting = Starting(threading.Thread(target=lambda: starting.run(pg.start), daemon=True))
    c.pg_starting = starting
    starting.thread.start()


def poll_postgres(c: Chaos) -> None:
    starting = c.pg_starting
    if starting is None or starting.thread.is_alive():
        return
    c.pg_starting = None
    if starting.error is not None:
        log(f"t={c.now():5.1f}s PostgreSQL did not start ({starting.error!r}); trying again",
            always=True)
        c.schedule(1.0, "start_postgres")
        return
    assert c.db_down is not None
    c.db_down = (c.db_down[0], c.now())
    c.tally.events["postgres_restarts"] += 1
    log(f"t={c.now():5.1f}s PostgreSQL started again (down {c.now() - c.db_down[0]:.1f}s)")


def kill_backend(c: Chaos, arg: str | tuple[str, int]) -> None:
    """``pg_terminate_backend`` of one database connection of a worker or dispatcher
    (connections are told apart by the application_name each process was given)."""
    role, tries = (arg, 0) if isinstance(arg, str) else arg
    with c.servers.engine.connect() as conn:
        backends = conn.execute(sa.text(
            "SELECT pid, application_name, state FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE :app"),
            {"app": f"{APP_PREFIX}{role}%"}).all()
        if not backends:
            if tries < 40:
                c.schedule(0.25, "kill_backend", (role, tries + 1))
            return
        victim = c.rng.choice(backends)
        done = conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"),
                            {"pid": victim.pid}).scalar()
    if done:
        c.tally.events["backend_kills"] += 1
        c.tally.events[f"backend_kills_{role}"] += 1
    log(f"t={c.now():5.1f}s pg_terminate_backend({victim.pid}) of "
        f"{victim.application_name} ({victim.state}): {'done' if done else 'gone already'}")
