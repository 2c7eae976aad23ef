"""Process chaos: SIGKILL of pool children, whole workers and dispatchers, the restarts
that follow, and restarting what died on its own."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil
import sqlalchemy as sa

from bench.chaos.fleet import Member
from bench.chaos.log import log
from bench.chaos.plan import DISPATCHER_POINT
from bench.chaos.state import Chaos


def is_stopped(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_STOPPED)
    except psutil.Error:
        return False


def lease_holders(c: Chaos) -> dict[int, Member]:
    """Pool children that hold a live lease right now, with their worker."""
    with c.servers.engine.connect() as conn:
        owners = conn.execute(sa.text(
            "SELECT lease_owner FROM onward.runs WHERE status = 'running' "
            "AND lease_owner IS NOT NULL AND lease_expires_at > now() "
            "AND id = ANY(:ids)"), {"ids": c.run_ids}).scalars().all()
    pids = set()
    for owner in owners:
        with contextlib.suppress(ValueError):
            pids.add(int(owner.rsplit(":", 1)[1]))
    return {child: worker for worker in c.fleet.live("worker")
            for child in worker.proc.children() if child in pids and killable(c, child)}


def killable(c: Chaos, pid: int) -> bool:
    """Not already killed, not SIGSTOPped (by us or by a stop fault)."""
    return pid not in c.killed_pids and pid not in c.stopped and not is_stopped(pid)


def idle_children(c: Chaos, worker: Member) -> list[int]:
    return [pid for pid in worker.proc.children() if killable(c, pid)]


def kill_child(c: Chaos, tries: int) -> None:
    """SIGKILL a pool child, preferably one that holds a lease."""
    holders = lease_holders(c)
    if not holders and tries < 8:
        c.schedule(0.25, "kill_child", tries + 1)
        return
    if holders:
        pid = c.rng.choice(sorted(holders))
        worker, how = holders[pid], "lease holder"
    else:
        # A prefork child killed while its pool is still starting makes Celery give up
        # ("Could not start worker processes"): idle children only of settled workers.
        workers = [w for w in c.fleet.workers_ready(for_s=3.0) if idle_children(c, w)]
        if not workers:
            _no_child_yet(c, tries)
            return
        worker = c.rng.choice(workers)
        pid, how = c.rng.choice(idle_children(c, worker)), "idle child (no lease held)"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
        c.killed_pids.add(pid)
        c.tally.kills["worker_child"] += 1
        if holders:
            c.tally.kills_detail["worker_child_lease_holder"] += 1
        log(f"t={c.now():5.1f}s SIGKILL {how} pid {pid} of {worker.name}")


def _no_child_yet(c: Chaos, tries: int) -> None:
    if tries < 60:
        c.schedule(0.5, "kill_child", tries + 1)
    else:
        log(f"t={c.now():5.1f}s kill_child: no worker child to kill, skipped")
        c.tally.events["kill_child_skipped"] += 1


def kill_tree(c: Chaos, arg: tuple[str, int]) -> None:
    """Kill a whole worker (a host dying). Only a worker that is up and whose armed
    fault point has fired is a candidate, so that every point gets its chance; after
    ~20 s of waiting any live worker will do."""
    point, tries = arg
    ready = [w for w in c.fleet.workers_ready()
             if not any(pid in c.stopped or is_stopped(pid) for pid in w.proc.children())]
    workers = [w for w in ready if w.all_fired()]
    if not workers and tries < 40:
        c.schedule(0.5, "kill_tree", (point, tries + 1))
        return
    workers = workers or ready
    if not workers:
        c.schedule(0.5, "kill_tree", (point, tries + 1))
        return
    worker = c.rng.choice(workers)
    children = len(worker.proc.children())
    worker.proc.kill_tree()
    c.tally.kills["worker_tree"] += 1
    faults = ",".join(filter(None, [point, worker.unfired()]))  # carry over
    delay = c.rng.uniform(0.2, 2.0)
    log(f"t={c.now():5.1f}s SIGKILL worker tree {worker.name} ({children} children); "
        f"restart in {delay:.1f}s" + (f" with {faults}" if faults else ""))
    c.schedule(delay, "restart_worker", (worker.slot, faults))


def kill_dispatcher(c: Chaos, point: str) -> None:
    live = [d for d in c.fleet.live("dispatcher") if d.all_fired()]
    if not live:  # none up, or the one up still waits for its armed point
        c.schedule(0.5, "kill_dispatcher", point)
        return
    member = c.rng.choice(live)
    member.proc.kill_tree()
    c.tally.kills["dispatcher"] += 1
    faults = f"{point}:kill:once" if point else ""
    delay = c.rng.uniform(0.5, 3.0)
    log(f"t={c.now():5.1f}s SIGKILL {member.name}; restart in {delay:.1f}s"
        + (f" with {faults}" if faults else ""))
    c.schedule(delay, "restart_dispatcher", (member.slot, faults))


def restart_worker(c: Chaos, arg: tuple[int, str]) -> None:
    slot, faults = arg
    member = c.fleet.worker(slot, faults)
    log(f"t={c.now():5.1f}s started {member.name}" + (f" [{faults}]" if faults else ""))


def restart_dispatcher(c: Chaos, arg: tuple[int, str]) -> None:
    slot, faults = arg
    member = c.fleet.dispatcher(slot, faults)
    log(f"t={c.now():5.1f}s started {member.name}" + (f" [{faults}]" if faults else ""))


def restart_reaper(c: Chaos, slot: int) -> None:
    member = c.fleet.reaper(slot)
    log(f"t={c.now():5.1f}s started {member.name}")


def check_processes(c: Chaos) -> None:
    """Restart what died without us killing it (a dispatcher at its fault point, ...)."""
    for (role, slot), member in list(c.fleet.current.items()):
        if member.alive() or member.proc.ended_by_us() or member.pid in c.expected_dead:
            continue
        c.expected_dead.add(member.pid)
        code = member.proc.popen.returncode
        if role == "dispatcher" and member.faults and code == -signal.SIGKILL:
            log(f"t={c.now():5.1f}s {member.name} killed itself at {DISPATCHER_POINT}; "
                "restarting it")
            c.schedule(c.rng.uniform(0.3, 1.5), "restart_dispatcher", (slot, ""))
            continue
        delay = _note_exit(c, member, code)
        if role == "worker":  # arm again what never fired
            c.schedule(delay, "restart_worker", (slot, member.unfired()))
        elif role == "dispatcher":
            c.schedule(delay, "restart_dispatcher", (slot, ""))
        else:
            c.schedule(delay, "restart_reaper", slot)


def _note_exit(c: Chaos, member: Member, code: int | None) -> float:
    """Record an exit we did not cause; the delay before the restart."""
    if c.db_is_down():  # e.g. started while PostgreSQL was down: it refuses to run
        c.tally.exits_while_db_down.append(f"{member.name} exited {code}")
        log(f"t={c.now():5.1f}s {member.name} exited ({code}) while PostgreSQL was "
            f"down or just back; restarting it:\n{member.proc.tail(600)}")
        return 2.0
    c.tally.unexpected_exits.append(f"{member.name} exited {code}")
    log(f"t={c.now():5.1f}s WARNING {member.name} exited unexpectedly ({code}):\n"
        f"{member.proc.tail(2000)}", always=True)
    return 0.5
