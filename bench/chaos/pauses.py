"""Stale lease holders (opt-in): a lease holder SIGSTOPped, or stopped by its own armed
``after_effect_pending:stop`` point, is SIGCONTed once another worker has taken its step
over and committed it (design scenario 16, "lease holder paused past TTL, then resumes")."""

from __future__ import annotations

import contextlib
import os
import signal

import sqlalchemy as sa

from bench.chaos.kills import lease_holders
from bench.chaos.log import log
from bench.chaos.state import Chaos, Stopped

MAX_PAUSE_S = 30.0


def pause_holder(c: Chaos, tries: int) -> None:
    """SIGSTOP a lease holder past its lease; continue_stopped() SIGCONTs it later."""
    holders = lease_holders(c)
    if not holders:
        if tries < 40:
            c.schedule(0.25, "pause_holder", tries + 1)
        return
    pid = c.rng.choice(sorted(holders))
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
        c.tally.events["pauses"] += 1
        track_stopped(c, pid, f"SIGSTOP lease holder pid {pid} of {holders[pid].name}")


def track_stopped(c: Chaos, pid: int, what: str) -> None:
    with c.servers.engine.connect() as conn:
        row = conn.execute(sa.text(
            "SELECT id, seq FROM onward.runs WHERE lease_owner LIKE :owner "
            "AND id = ANY(:ids)"), {"owner": f"%:{pid}", "ids": c.run_ids}).first()
    c.stopped[pid] = Stopped(pid, c.now() + MAX_PAUSE_S, row.id if row else None,
                             row.seq if row else None)
    log(f"t={c.now():5.1f}s {what}; SIGCONT once another worker has committed run "
        f"{row.id if row else '?'} seq {row.seq if row else '?'} (30 s at most)")


def continue_stopped(c: Chaos) -> None:
    """Track processes stopped at their point; SIGCONT those whose step moved on."""
    for marker, pid in c.fleet.stop_markers():
        if marker not in c.stop_markers_seen:
            c.stop_markers_seen.add(marker)
            c.tally.events["pauses_at_point"] += 1
            track_stopped(c, pid, f"pid {pid} stopped itself at after_effect_pending")
    for pid, stop in list(c.stopped.items()):
        _note_takeover(c, stop)
        # half a second after the takeover committed: the provider forgot the key by then
        due = stop.taken_over_at is not None and c.now() >= stop.taken_over_at + 0.5
        if due or c.now() >= stop.max_at:
            del c.stopped[pid]
            _resume(c, pid, due)


def _note_takeover(c: Chaos, stop: Stopped) -> None:
    if stop.taken_over_at is not None or stop.run_id is None:
        return
    with c.servers.engine.connect() as conn:
        seq = conn.execute(sa.text("SELECT seq FROM onward.runs WHERE id = :id"),
                           {"id": stop.run_id}).scalar_one()
    if stop.seq is not None and seq > stop.seq:
        stop.taken_over_at = c.now()


def _resume(c: Chaos, pid: int, taken_over: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
        log(f"t={c.now():5.1f}s SIGCONT pid {pid} ("
            + ("its step was committed by another worker" if taken_over else
               "no takeover within 30 s") + ")")
        c.tally.events["stale_holders_resumed_after_takeover" if taken_over
                       else "stopped_resumed_without_takeover"] += 1
