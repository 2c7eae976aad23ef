"""``make demo``: a batch of research agents survives a worker SIGKILLed in the middle of a step.

What it does, with real processes only (nothing here fakes a part of onward):

1. ``onward db upgrade`` on the ledger database: the embedded PostgreSQL and Redis under
   ``.onward/`` by default, or the servers named by ONWARD_DATABASE_URL / ONWARD_BROKER_URL;
2. starts a dispatcher, a reaper and two ``onward worker`` processes (Celery prefork) on a
   queue of its own, with short timings so that recovery fits in a few seconds;
3. starts a batch of ``research_agent`` runs (five steps each, see examples/research.py);
4. waits until some run is in the middle of a step (a live lease, two steps already
   committed), and SIGKILLs the whole worker that holds that lease: master and pool
   children, as when a host dies. Then starts a replacement worker;
5. waits until every run is terminal, prints the killed run's timeline from the ledger, and
   prints ONE line of JSON on stdout, computed from the ledger.

Everything human-readable goes to stderr; stdout carries only the final JSON line. The exit
status is non-zero if a run did not complete or a step was committed twice (see report()).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TypeVar
from uuid import UUID

from rich.console import Console
from rich.table import Table

from ledger import AttemptOutcome, Ledger, OnwardSettings, Run, RunStatus
from ledger.stats import BatchStats

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = "research_agent"
T = TypeVar("T")

# Demo-friendly timings: steps stay in flight long enough to be killed, a lost lease is
# noticed within seconds, stalled runs are re-sent quickly. The outbox grace keeps its
# default: a shorter one republishes every message still queued behind the backlog, and
# each copy would only show up as a stale delivery.
DEMO_ENV = {
    "ONWARD_WORKFLOWS": "examples.research",
    "ONWARD_EXAMPLE_STEP_MS": "150",
    "ONWARD_LEASE_TTL_S": "3",
    "ONWARD_REAPER_INTERVAL_S": "0.5",
    "ONWARD_OUTBOX_GRACE_S": "5",
    "ONWARD_OUTBOX_REPUBLISH_S": "10",
    "ONWARD_STALL_AFTER_S": "5",
    "ONWARD_DISPATCHER_POLL_S": "0.5",
    "ONWARD_RETRY_BASE_S": "0.2",
    "ONWARD_RETRY_MAX_S": "2",
}

console = Console(stderr=True, highlight=False, soft_wrap=True)
STARTED = time.monotonic()


def phase(title: str, detail: str = "") -> None:
    """A numbered stage of the demo, with the seconds since the demo started."""
    console.print(f"[dim]{time.monotonic() - STARTED:5.1f}s[/dim] [bold]{title}[/bold] {detail}")


class DemoFailed(Exception):
    """The demo could not do what it set out to do (a process died, a deadline passed)."""


def wait_for(predicate: Callable[[], T | None], *, timeout: float, what: str,
             interval: float = 0.02) -> T:
    """Poll until ``predicate()`` is truthy, or raise DemoFailed at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise DemoFailed(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# -- processes ------------------------------------------------------------------------------
@dataclass
class Proc:
    """One ``onward`` subprocess, leader of its own process group (the pool children too)."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    killed: bool = False  # by the demo, on purpose

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def group_pids(self) -> list[int]:
        """Every live process in this process's group: the worker and its pool children."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.pid:  # field 5 of /proc/PID/stat: the process group
                pids.append(int(stat.parent.name))
        return sorted(pids)

    def kill_group(self) -> None:
        """SIGKILL the whole group at once: no warm shutdown, no ack, no cleanup."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def terminate(self) -> None:
        """Ask for a warm shutdown: a worker finishes the step it runs, then exits."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)

    def wait_or_kill(self, deadline: float) -> None:
        try:
            self.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill_group()


@dataclass
class Fleet:
    env: dict[str, str]
    log_dir: Path
    procs: list[Proc] = field(default_factory=list)
    pid_names: dict[int, str] = field(default_factory=dict)  # pool child pid -> worker name

    def start(self, name: str, *args: str) -> Proc:
        log_path = self.log_dir / f"{len(self.procs):02d}-{name}.log"
        with open(log_path, "wb") as handle:
            popen = subprocess.Popen(
                [sys.executable, "-m", "console", *args],
                cwd=ROOT, env=self.env, stdout=handle, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches the demo only; it stops them in order
            )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def worker(self, name: str) -> Proc:
        return self.start(name, "worker", "-c", "2", "--name", f"{name}@{socket.gethostname()}")

    def workers(self) -> list[Proc]:
        return [p for p in self.procs if p.name.startswith("worker")]

    def wait_ready(self, procs: list[Proc]) -> None:
        def ready() -> bool:
            for proc in procs:
                if not proc.alive():
                    raise DemoFailed(f"{proc.name} exited:\n{proc.log()[-3000:]}")
            return all("ready." in proc.log() for proc in procs)

        wait_for(ready, timeout=90, what=", ".join(p.name for p in procs) + " to be ready")
        self.remember_pids()

    def remember_pids(self) -> None:
        for proc in self.workers():
            for pid in proc.group_pids():
                self.pid_names.setdefault(pid, proc.name)

    def check_alive(self) -> None:
        for proc in self.procs:
            if not proc.alive() and not proc.killed:
                raise DemoFailed(f"{proc.name} exited:\n{proc.log()[-3000:]}")

    def stop_all(self, timeout: float = 15.0) -> None:
        for proc in self.procs:
            proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.wait_or_kill(deadline)


# -- the demo -------------------------------------------------------------------------------
def demo_env(queue: str) -> dict[str, str]:
    env = {**os.environ, **DEMO_ENV, "ONWARD_QUEUE": queue}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("ONWARD_HOME", str(ROOT / ".onward"))
    return env


def servers(settings: OnwardSettings) -> None:
    from ledger.db import database_url
    from workers.broker import broker_url

    where = "embedded, under " + str(settings.home_dir) if settings.embedded else "from ONWARD_*"
    phase("1. servers", f"({where})")
    console.print(f"   ledger  {_hide_password(database_url(settings))}")
    console.print(f"   broker  {_hide_password(broker_url(settings))}")


def _hide_password(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # a URL we cannot parse is shown as given
        return url


def upgrade(env: dict[str, str]) -> None:
    phase("2. onward db upgrade")
    done = subprocess.run([sys.executable, "-m", "console", "db", "upgrade"], cwd=ROOT, env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise DemoFailed(f"onward db upgrade failed:\n{done.stdout}{done.stderr}")
    console.print("   " + done.stdout.strip())


def pick_victim(ledger: Ledger, run_ids: set[UUID], fleet: Fleet,
                min_seq: int) -> tuple[Run, Proc]:
    """A run of this batch in the middle of a step, and the worker that runs it.

    Polls the ledger every few milliseconds and takes a run whose lease epoch moved since
    the previous poll (a claim that just happened, so its 150 ms step has barely begun),
    held by a pool child of one of our workers, with ``min_seq`` steps already committed.
    Comparing epochs, not clocks, keeps this right when the database runs elsewhere.
    """
    by_group = {proc.pid: proc for proc in fleet.workers() if proc.alive()}
    host = socket.gethostname()
    epochs: dict[UUID, int] = {}

    def just_claimed() -> tuple[Run, Proc] | None:
        found = None
        for run in ledger.list_runs(status=RunStatus.RUNNING, workflow=WORKFLOW, limit=1000):
            if run.id not in run_ids:
                continue
            previous, epochs[run.id] = epochs.get(run.id), run.lease_epoch
            if found or previous is None or previous == run.lease_epoch:
                continue
            if run.seq < min_seq or run.lease_owner is None:
                continue
            owner_host, _, pid = run.lease_owner.rpartition(":")
            try:
                group = os.getpgid(int(pid)) if owner_host == host else None
            except (ProcessLookupError, ValueError):
                group = None
            if group in by_group:
                found = run, by_group[group]
        return found

    return wait_for(just_claimed, timeout=30, what="a run in the middle of a step",
                    interval=0.005)


def wait_all_terminal(ledger: Ledger, run_ids: list[UUID], fleet: Fleet,
                      timeout: float) -> None:
    phase(f"6. waiting for {len(run_ids)} runs to end", f"(deadline {timeout:.0f}s)")
    last_line, last_at = "", -1.0

    def ended() -> bool:
        nonlocal last_line, last_at
        fleet.check_alive()
        s = ledger.batch_stats(run_ids)
        done = s.completed + s.failed + s.parked == s.runs
        line = (f"completed {s.completed:>3}/{s.runs}  failed {s.failed}  parked {s.parked}  "
                f"steps committed {s.steps_committed:>3}  restores {s.restores}  "
                f"stale deliveries {s.stale_deliveries}")
        now = time.monotonic()
        if line != last_line and (done or now - last_at >= 1.0):
            console.print(f"[dim]{now - STARTED:5.1f}s[/dim]    {line}")
            last_line, last_at = line, now
        return done

    wait_for(ended, timeout=timeout, what="every run to end", interval=0.25)


def timeline_table(ledger: Ledger, run_id: UUID, names: dict[int, str]) -> Table:
    table = Table(title=f"timeline of run {run_id}", title_justify="left")
    for column in ("seq", "step", "attempt", "worker", "outcome", "ms"):
        table.add_column(column, justify="right" if column in ("seq", "attempt", "ms") else "left")
    for entry in ledger.timeline(run_id):
        pid = int(entry.worker.rpartition(":")[2] or 0)
        who = f"{names.get(pid, '?')} pid {pid}"
        outcome = entry.outcome or "(running)"
        if outcome == AttemptOutcome.WORKER_LOST:
            outcome = f"[bold red]{outcome}[/bold red]"
        elif outcome == AttemptOutcome.COMMITTED:
            outcome = f"[green]{outcome}[/green]"
        ms = f"{entry.duration_ms:.0f}" if entry.duration_ms is not None else "-"
        table.add_row(str(entry.seq), entry.step or "-", str(entry.attempt), who, outcome, ms)
    return table


def count_lost_steps(ledger: Ledger, run_ids: list[UUID]) -> int:
    """Step attempts that ended because their worker died (BatchStats has no such count)."""
    return sum(
        1
        for run_id in run_ids
        for entry in ledger.timeline(run_id)
        if entry.outcome == AttemptOutcome.WORKER_LOST
    )


def kill_mid_step(ledger: Ledger, run_ids: list[UUID], fleet: Fleet) -> Run:
    """SIGKILL the worker running a step of some run; start a replacement; return the run."""
    victim, owner = pick_victim(ledger, set(run_ids), fleet, min_seq=2)
    fleet.remember_pids()
    group = owner.group_pids()
    owner.kill_group()
    owner.killed = True
    holder = (victim.lease_owner or "?").rpartition(":")[2]
    phase("5. SIGKILL", f"{owner.name} (pids {', '.join(map(str, group))}) while its pool "
          f"process {holder} ran step [bold]{victim.step}[/bold] (seq {victim.seq}) "
          f"of run {victim.id}")
    replacement = fleet.worker(f"worker-{len(fleet.workers()) + 1}")
    console.print(f"   started replacement {replacement.name} pid {replacement.pid}")
    return victim


def report(stats: BatchStats, lost: int, elapsed: float) -> list[str]:
    """Explain the counts on stderr; return what went wrong, if anything."""
    steps = f"{lost} step{'s' if lost != 1 else ''}"
    console.print(
        f"\n{stats.completed}/{stats.runs} runs completed in {elapsed:.1f}s. The killed worker "
        f"held {steps} in flight; they went back to the fleet when their leases expired "
        f"({stats.restores} restores), and each run resumed from its last "
        "checkpoint: the steps it had committed did not run again.")
    console.print(f"  duplicate_commits          {stats.duplicate_commits:>4}  "
                  "checkpoints committed twice for one step (must be 0)")
    console.print(f"  completed_steps_reexecuted {stats.completed_steps_reexecuted:>4}  "
                  "steps started again after their commit (must be 0)")
    console.print(f"  stale_deliveries           {stats.stale_deliveries:>4}  "
                  "duplicate or late messages the claim turned into no-ops")
    problems = []
    if stats.completed != stats.runs:
        problems.append(f"{stats.runs - stats.completed} run(s) did not complete")
    if stats.duplicate_commits or stats.completed_steps_reexecuted or stats.runs_with_gaps:
        problems.append("a step was committed twice, re-executed after its commit, or skipped")
    if lost == 0:
        problems.append("the ledger recorded no step lost with the killed worker")
    return problems


def run_demo(runs: int, deadline_s: float) -> int:
    queue = f"demo.{secrets.token_hex(4)}"
    env = demo_env(queue)
    os.environ.update({k: v for k, v in env.items() if k.startswith("ONWARD_")})
    settings = OnwardSettings()
    servers(settings)
    upgrade(env)
    ledger = Ledger.from_env(settings)

    log_dir = settings.home_dir / "demo" / datetime.now().strftime("%Y%m%d-%H%M%S")
    log_dir.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(env=env, log_dir=log_dir)
    try:
        phase("3. processes", f"on queue {queue} (logs in {log_dir})")
        fleet.start("dispatcher", "dispatcher")
        fleet.start("reaper", "reaper")
        fleet.wait_ready([fleet.worker("worker-1"), fleet.worker("worker-2")])
        for proc in fleet.procs:
            console.print(f"   {proc.name:<11} pid {proc.pid}")

        phase(f"4. starting {runs} runs of {WORKFLOW}",
              f"(5 steps each, {DEMO_ENV['ONWARD_EXAMPLE_STEP_MS']} ms per step)")
        batch = f"demo-{secrets.token_hex(3)}"
        run_ids = [
            ledger.start_run(WORKFLOW, {"topic": f"topic-{i:02d}"}, conversation_id=batch,
                             idempotency_key=f"{batch}:{i}")
            for i in range(runs)
        ]
        victim = kill_mid_step(ledger, run_ids, fleet)
        wait_all_terminal(ledger, run_ids, fleet, timeout=deadline_s)
        fleet.remember_pids()
        console.print()
        console.print(timeline_table(ledger, victim.id, fleet.pid_names))
        stats = ledger.batch_stats(run_ids)
        lost = count_lost_steps(ledger, run_ids)
    finally:
        fleet.stop_all()

    problems = report(stats, lost, time.monotonic() - STARTED)
    hint = "    stop the embedded servers: onward embedded down" if settings.embedded else ""
    console.print(f"inspect: onward runs show {victim.id}{hint}")
    for problem in problems:
        console.print(f"[bold red]FAILED:[/bold red] {problem}")
    summary = {
        "runs": stats.runs,
        "completed": stats.completed,
        "steps_committed": stats.steps_committed,
        "duplicate_commits": stats.duplicate_commits,
        "completed_steps_reexecuted": stats.completed_steps_reexecuted,
        "stale_deliveries": stats.stale_deliveries,
        "restores": stats.restores,
        "workers_killed": sum(proc.killed for proc in fleet.procs),
    }
    print(json.dumps(summary), flush=True)
    return 1 if problems else 0


def _interrupt(signum: int, _frame: object) -> None:
    """SIGTERM takes the same path as Ctrl-C: stop every subprocess, then exit."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=24, help="runs in the batch (default 24)")
    parser.add_argument("--deadline", type=float, default=90.0,
                        help="seconds to wait for every run to end (default 90)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in background
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run_demo(args.runs, args.deadline)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every demo process was stopped[/yellow]")
        return 130
    except DemoFailed as exc:
        console.print(f"[bold red]demo failed:[/bold red] {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
