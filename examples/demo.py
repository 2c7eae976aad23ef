"""``make demo``: research agents survive a worker SIGKILLed mid-step, and a sales agent's
offer reaches the CRM once although its worker died between the CRM's answer and the ledger.

What it does, with real processes only (nothing here fakes a part of onward):

1. ``onward db upgrade`` on the ledger database: the embedded PostgreSQL and Redis under
   ``.onward/`` by default, or the servers named by ONWARD_DATABASE_URL / ONWARD_BROKER_URL;
2. starts the reference provider (examples/provider.py, a real HTTP service on loopback with
   its own store under the demo's log directory), the model server the research agent calls
   through the ``openai`` client (examples/model_server.py, OpenAI chat completions on
   loopback, 150 ms a call), a dispatcher, a reaper and one sales
   worker ``crm-1`` (``onward worker -c 2``, Celery prefork, importing only
   examples.sales), on a queue of its own, with short timings so that recovery fits in a
   few seconds;
3. starts a few ``sales_offer_agent`` runs (examples/sales.py: classify, draft, approval,
   CRM offer, email); once each waits for approval of its drafted offer, stops ``crm-1``:
   no process at all runs the sales agent now, and the runs wait, holding no lease;
4. starts two research workers (importing only examples.research) and a batch of
   ``research_agent`` runs (five steps each, see examples/research.py); waits until some
   run is in the middle of a step (a live lease, two steps already committed), and SIGKILLs
   the whole worker that holds that lease: master and pool children, as when a host dies.
   Then starts a replacement worker, and ``crm-2`` for the sales agent, armed with
   ONWARD_FAULTS="after_provider_response@create:kill:once": its pool process will SIGKILL
   itself right after the CRM accepted an offer, before onward recorded the answer;
5. waits until every research run is terminal and prints the killed run's timeline;
6. approves each offer through ``Ledger.approve`` as "dana" (role sales_lead), bound to the
   hash of the artifact she saw, after showing that an approval of an edited draft is
   refused; the runs resume, one worker dies after the CRM's answer, the resumed step asks
   the CRM by idempotency key, finds the offer and records it (reconciled), and emails;
7. prints that run's timeline and its CRM effect's attempts from the ledger, counts the
   CRM's objects through the provider's own /admin/stats, and prints ONE line of JSON on
   stdout.

Research and sales workers import different workflows, and a run's first message goes to
the base queue every worker consumes (later ones to the run's version queue): so the sales
runs start while crm-1 is the only worker, and crm-2 starts once every research run is past
its first step. No step is ever handed to a worker without its code.

Everything human-readable goes to stderr; stdout carries only the final JSON line. The exit
status is non-zero if a run did not complete, a step was committed twice, the CRM holds a
duplicate or a number of objects other than one offer and one email per sales run, or a
planned failure did not happen (see report() and sales_report()).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from rich.console import Console
from rich.table import Table

from harness.databases import redact
from harness.errors import HarnessError
from harness.model_server import ModelServer
from harness.processes import ROOT, Proc, Processes, wait_ready
from harness.provider import ReferenceProvider
from harness.waiting import wait_for
from ledger import (
    Approval,
    ApprovalRefused,
    ApprovalStatus,
    AttemptOutcome,
    BatchStats,
    Effect,
    EffectStatus,
    Ledger,
    OnwardSettings,
    Run,
    RunStatus,
)
from tasks import artifact_hash

WORKFLOW = "research_agent"
SALES_WORKFLOW = "sales_offer_agent"

# The sales workers import only the sales agent (the research workers only the research
# agent), so sales steps go to the sales version queue, served by crm-1, then crm-2 alone.
SALES_ENV = {"ONWARD_WORKFLOWS": "examples.sales"}
CRM_FAULT = "after_provider_response@create:kill:once"
CUSTOMERS = [("c-1001", 1200), ("c-1002", 800), ("c-1003", 2500), ("c-1004", 1500),
             ("c-1005", 990)]
APPROVER, APPROVER_ROLES = "dana", ("sales_lead",)

# Demo-friendly timings: steps stay in flight long enough to be killed, a lost lease is
# noticed within seconds, stalled runs are re-sent quickly. The outbox grace keeps its
# default: a shorter one republishes every message still queued behind the backlog, and
# each copy would only show up as a stale delivery.
MODEL_LATENCY_MS = "150"  # how long the loopback model server takes to answer a call
DEMO_ENV = {
    "ONWARD_WORKFLOWS": "examples.research",
    "ONWARD_LEASE_TTL_S": "3",
    # a model call's lease covers its time limit: a worker killed mid-call leaves its run
    # to the reaper after that (60 s by default; the model server answers in 150 ms)
    "ONWARD_RESEARCH_MODEL_TIMEOUT_S": "5",
    # likewise a CRM call's lease covers the tool's time limit (30 s by default): the sales
    # worker the fault kills after the CRM's answer leaves its run to the reaper after that
    "ONWARD_TOOL_TIMEOUT_S": "5",
    "ONWARD_REAPER_INTERVAL_S": "0.5",
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


class DemoFailed(HarnessError):
    """The demo could not do what it set out to do (a process died, a deadline passed)."""


# -- processes ------------------------------------------------------------------------------
@dataclass
class Fleet(Processes):
    """The demo's processes (harness/processes.py: each leads its own process group, so a
    worker and its pool children die together), and which worker each pool pid served."""

    pid_names: dict[int, str] = field(default_factory=dict)  # pool child pid -> worker name

    def workers(self) -> list[Proc]:
        """The research workers (the ones the demo may SIGKILL)."""
        return [p for p in self.procs if p.name.startswith("worker")]

    def all_workers(self) -> list[Proc]:
        return [p for p in self.procs if p.name.startswith(("worker", "crm"))]

    def wait_ready(self, procs: list[Proc]) -> None:
        wait_ready(procs, timeout=90)
        self.remember_pids()

    def remember_pids(self) -> None:
        for proc in self.all_workers():
            for pid in proc.tree():
                self.pid_names.setdefault(pid, proc.name)


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
    console.print(f"   ledger  {redact(database_url(settings))}")
    console.print(f"   broker  {redact(broker_url(settings))}")


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
    phase(f"9. waiting for {len(run_ids)} research runs to end", f"(deadline {timeout:.0f}s)")
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
    owner.kill_tree()  # at once: every millisecond spent here lets the step commit first
    group = sorted(pid for pid, name in fleet.pid_names.items() if name == owner.name)
    holder = (victim.lease_owner or "?").rpartition(":")[2]
    phase("8. SIGKILL", f"{owner.name} (pids {', '.join(map(str, group))}) while its pool "
          f"process {holder} ran step [bold]{victim.step}[/bold] (seq {victim.seq}) "
          f"of run {victim.id}")
    replacement = fleet.worker(f"worker-{len(fleet.workers()) + 1}")
    console.print(f"   started replacement {replacement.name} pid {replacement.pid}")
    return victim


# -- the sales-offer story --------------------------------------------------------------------
def start_sales_runs(ledger: Ledger, count: int, batch: str) -> list[UUID]:
    return [
        ledger.start_run(SALES_WORKFLOW, {"customer_id": customer, "amount": amount},
                         conversation_id=f"{batch}-sales",
                         idempotency_key=f"{batch}:offer:{customer}")
        for customer, amount in (CUSTOMERS * (count // len(CUSTOMERS) + 1))[:count]
    ]


def pending_approvals(ledger: Ledger, run_ids: list[UUID]) -> dict[UUID, Approval]:
    found: dict[UUID, Approval] = {}
    for run_id in run_ids:
        pending = ledger.approvals(run_id=run_id, status=ApprovalStatus.PENDING)
        if pending:
            found[run_id] = pending[0]
    return found


def sales_waiting(ledger: Ledger, run_ids: list[UUID]) -> list[Run]:
    runs = [ledger.get_run(run_id) for run_id in run_ids]
    return [r for r in runs if r is not None and r.status is RunStatus.WAITING]


def park_sales_runs(ledger: Ledger, run_ids: list[UUID], fleet: Fleet, crm: Proc) -> bool:
    """Wait until every sales run waits for approval; stop the only sales worker and show the
    runs still wait holding nothing. Returns whether they did."""
    def all_waiting() -> bool:
        fleet.check_alive()
        return len(sales_waiting(ledger, run_ids)) == len(run_ids)

    wait_for(all_waiting, timeout=60, what="every sales run to wait for approval",
             interval=0.1)
    approvals = pending_approvals(ledger, run_ids)
    phase(f"5. {len(run_ids)} sales runs drafted an offer and wait for approval",
          "(classify → draft committed)")
    for run_id in run_ids:
        approval = approvals.get(run_id)
        if approval is not None:
            artifact = approval.artifact
            console.print(f"   run {run_id}  approval {approval.id}: {approval.action} "
                          f"{artifact['amount']} EUR to {artifact['customer_id']}, approvers "
                          f"{', '.join(approval.approvers)}")
    crm.stop(timeout=15)  # on purpose: a warm shutdown, not a crash
    runs = sales_waiting(ledger, run_ids)
    leases = sum(1 for r in runs if r.lease_owner is not None)
    console.print(f"   stopped {crm.name} (warm shutdown): no process runs {SALES_WORKFLOW} "
                  f"now; {len(runs)}/{len(run_ids)} runs still waiting, {leases} leases held")
    return len(runs) == len(run_ids) and leases == 0


def start_armed_sales_worker(ledger: Ledger, research_ids: list[UUID], fleet: Fleet) -> Proc:
    """Start crm-2 with the CRM fault armed, once no research run is at its first step.

    A run's first message goes to the base queue, which every worker consumes (its version
    is not bound yet); a sales-only worker taking a research run's first step would hand it
    back. Later steps go to the run's version queue, which only research workers serve."""
    def first_steps_done() -> bool:
        fleet.check_alive()
        return all(r is not None and r.seq >= 1 for r in map(ledger.get_run, research_ids))

    wait_for(first_steps_done, timeout=60, what="every research run's first step",
             interval=0.1)
    crm = fleet.worker("crm-2", env={**SALES_ENV, "ONWARD_FAULTS": CRM_FAULT})
    console.print(f"   started {crm.name} pid {crm.pid} for {SALES_WORKFLOW}, armed with "
                  f"ONWARD_FAULTS={CRM_FAULT}")
    return crm


def approve_offers(ledger: Ledger, run_ids: list[UUID]) -> int:
    """Dana approves each offer she saw; an approval of an edited draft is refused first.
    Returns how many approvals were refused."""
    approvals = pending_approvals(ledger, run_ids)
    refused = 0
    first = approvals[run_ids[0]]
    seen = first.artifact
    edited = {**seen, "amount": seen["amount"] - 200}
    phase("10. approvals", f"through Ledger.approve as {APPROVER} "
          f"(roles {', '.join(APPROVER_ROLES)})")
    dana = ledger.acting_as(APPROVER, "approver", APPROVER_ROLES)
    try:
        dana.approve(first.id, artifact_hash=artifact_hash(edited),
                     comment="ok at the edited price")
    except ApprovalRefused as exc:
        refused += 1
        console.print(f"   approving an edited draft ({edited['amount']} EUR instead of "
                      f"{seen['amount']}) is refused:")
        console.print(f"     [yellow]ApprovalRefused[/yellow]: {exc}")
    for run_id in run_ids:
        approval = approvals[run_id]
        seen_hash = artifact_hash(approval.artifact)  # what dana read, hashed on her side
        try:
            decided = dana.approve(approval.id, artifact_hash=seen_hash, comment="ok to send")
        except ApprovalRefused as exc:  # only if the edited draft was wrongly approved
            console.print(f"   [bold red]refused[/bold red] {approval.id}: {exc}")
            continue
        console.print(f"   approved {approval.id} (artifact {seen_hash[:12]}…): "
                      f"{decided.status.value} by {decided.decided_by}")
    return refused


def fault_fired(fleet: Fleet) -> int | None:
    """The pid the CRM fault killed, from its once-marker (None while it has not fired)."""
    for marker in (fleet.log_dir / "faults").glob("after_provider_response@create.*.fired"):
        with contextlib.suppress(ValueError, OSError):
            return int(marker.read_text() or 0)
    return None


def wait_sales_done(ledger: Ledger, run_ids: list[UUID], fleet: Fleet,
                    timeout: float) -> None:
    phase(f"11. waiting for {len(run_ids)} sales runs to end", f"(deadline {timeout:.0f}s)")
    last_line, last_at = "", -1.0
    announced = False

    def ended() -> bool:
        nonlocal last_line, last_at, announced
        fleet.check_alive()
        killed = fault_fired(fleet)
        if killed and not announced:
            announced = True
            name = fleet.pid_names.get(killed, "crm-2")
            phase("   fault", f"{name} pool process {killed} SIGKILLed itself right after "
                  "the CRM answered a create, before onward recorded the answer")
        s = ledger.batch_stats(run_ids)
        effects = [e for run_id in run_ids for e in ledger.effects(run_id)]
        done = s.completed + s.failed + s.parked == s.runs
        completed = sum(e.status is EffectStatus.COMPLETED for e in effects)
        pending = sum(e.status is EffectStatus.PENDING for e in effects)
        line = (f"completed {s.completed}/{s.runs}  failed {s.failed}  parked {s.parked}  "
                f"effects completed {completed}/{2 * len(run_ids)}  pending {pending}  "
                f"reconciled {sum(e.reconciled for e in effects)}  restores {s.restores}")
        now = time.monotonic()
        if line != last_line and (done or now - last_at >= 1.0):
            console.print(f"[dim]{now - STARTED:5.1f}s[/dim]    {line}")
            last_line, last_at = line, now
        return done

    wait_for(ended, timeout=timeout, what="every sales run to end", interval=0.25)


def reconciled_effect(ledger: Ledger, run_ids: list[UUID]) -> tuple[UUID, Effect] | None:
    """The CRM offer whose first call has no outcome (its worker died): the fault's victim."""
    for run_id in run_ids:
        for effect in ledger.effects(run_id):
            attempts = ledger.effect_attempts(effect)
            if attempts and attempts[0].kind == "call" and attempts[0].outcome is None:
                return run_id, effect
    return None


def effect_table(ledger: Ledger, effect: Effect, names: dict[int, str]) -> Table:
    table = Table(title=f"attempts of effect {effect.effect_type} {effect.effect_id[:12]}… "
                        "(its idempotency key)", title_justify="left")
    for column in ("attempt", "kind", "worker", "outcome", "provider ref", "ms"):
        table.add_column(column, justify="right" if column in ("attempt", "ms") else "left")
    for attempt in ledger.effect_attempts(effect):
        pid = int(attempt.worker.rpartition(":")[2] or 0)
        outcome = attempt.outcome or "[bold red]none: died[/bold red]"
        if attempt.outcome == "found":
            outcome = "[green]found[/green]"
        ms = (f"{(attempt.ended_at - attempt.started_at).total_seconds() * 1000:.0f}"
              if attempt.ended_at else "-")
        table.add_row(str(attempt.attempt), attempt.kind, f"{names.get(pid, '?')} pid {pid}",
                      outcome, attempt.provider_ref or "-", ms)
    return table


def sales_report(ledger: Ledger, run_ids: list[UUID], fleet: Fleet,
                 provider: ReferenceProvider,
                 held_nothing: bool, refused: int) -> tuple[list[str], dict[str, int]]:
    """Show the reconciled effect; check the CRM against the ledger. Returns (problems,
    JSON fields)."""
    stats = ledger.batch_stats(run_ids)
    problems = show_reconciled(ledger, run_ids, fleet)
    crm = provider.stats()  # what the outside world holds, from the provider itself
    objects = provider.objects()
    offers = {o["id"] for o in objects if o["collection"] == "offers"}
    recorded = {((run.result or {}) if run else {}).get("offer_id")
                for run in map(ledger.get_run, run_ids)}
    expected = 2 * len(run_ids)  # one offer and one email per run
    reconciled = sum(e.reconciled for r in run_ids for e in ledger.effects(r))
    print_crm_counts(stats, crm, len(run_ids), expected, reconciled, refused)
    problems += crm_problems(stats, crm, expected, recorded != offers, held_nothing, refused)
    fields = {"sales_runs": stats.runs, "sales_completed": stats.completed,
              "approvals_refused": refused, "effects_reconciled": reconciled,
              "provider_objects": int(crm["objects"]),
              "duplicate_provider_objects": int(crm["duplicate_objects"])}
    return problems, fields


def show_reconciled(ledger: Ledger, run_ids: list[UUID], fleet: Fleet) -> list[str]:
    """Print the fault's victim: its run's timeline and its CRM effect's attempts."""
    problems = []
    found = reconciled_effect(ledger, run_ids)
    if found is not None:
        run_id, effect = found
        console.print()
        console.print(timeline_table(ledger, run_id, fleet.pid_names))
        console.print(effect_table(ledger, effect, fleet.pid_names))
        attempts = ledger.effect_attempts(effect)
        steps = ["pending (intent recorded before the call)",
                 "call: the CRM created the offer, the worker died before recording it"]
        steps += [f"{a.kind}: {a.outcome}" + (f" {a.provider_ref}" if a.provider_ref else "")
                  for a in attempts[1:]]
        steps.append(f"reconciled={effect.reconciled}, status {effect.status.value}")
        console.print("   " + "\n   → ".join(steps))
        if not (effect.reconciled and effect.status is EffectStatus.COMPLETED):
            problems.append("the effect whose call lost its worker was not reconciled")
    else:
        problems.append("no CRM call lost its worker: the fault never fired")
    return problems


def print_crm_counts(stats: BatchStats, crm: dict[str, Any], runs: int, expected: int,
                     reconciled: int, refused: int) -> None:
    """What the CRM holds, asked through its own /admin/stats, against what must be."""
    console.print(
        f"\n{stats.completed}/{stats.runs} sales runs completed. The CRM (asked through its "
        f"own /admin/stats) holds {crm.get('by_collection', {}).get('offers', 0)} offers "
        f"and {crm.get('by_collection', {}).get('emails', 0)} emails for {runs} runs; "
        f"it created {crm.get('created', 0)} objects for {crm.get('requests', 0)} create "
        f"requests, and the run's retry asked it by key instead of creating again.")
    console.print(f"  provider_objects           {crm['objects']:>4}  "
                  f"objects in the CRM and mail API (must be {expected})")
    console.print(f"  duplicate_provider_objects {crm['duplicate_objects']:>4}  "
                  "objects created twice for one idempotency key (must be 0)")
    console.print(f"  effects_reconciled         {reconciled:>4}  "
                  "effects whose outcome was recovered by lookup after a lost answer")
    console.print(f"  approvals_refused          {refused:>4}  "
                  "the approval of an edited draft (must be 1)")


def crm_problems(stats: BatchStats, crm: dict[str, Any], expected: int, offers_differ: bool,
                 held_nothing: bool, refused: int) -> list[str]:
    """What went wrong for the sales runs and the CRM, if anything."""
    problems = []
    if stats.completed != stats.runs:
        problems.append(f"{stats.runs - stats.completed} sales run(s) did not complete")
    if stats.duplicate_commits or stats.completed_steps_reexecuted or stats.runs_with_gaps:
        problems.append("a sales step was committed twice, re-executed after its commit, or "
                        "skipped")
    if crm["duplicate_objects"]:
        problems.append(f"the CRM holds {crm['duplicate_objects']} duplicate object(s)")
    if crm["objects"] != expected:
        problems.append(f"the CRM holds {crm['objects']} objects, expected {expected}")
    if stats.completed == stats.runs and offers_differ:
        problems.append("the offers the runs recorded are not the offers the CRM holds")
    if not held_nothing:
        problems.append("a sales run held a lease (or stopped waiting) with no worker alive")
    if refused != 1:
        problems.append("the approval of an edited draft was not refused")
    return problems


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


def onward_command() -> str:
    """How to type ``onward`` in the shell that ran the demo: ``make demo`` does not activate
    ``.venv``, so unless its ``bin`` is on PATH the command is ``.venv/bin/onward`` (the
    script beside this interpreter, relative to the working directory when under it)."""
    script = Path(sys.executable).parent / "onward"
    found = shutil.which("onward")
    if not script.exists() or (found and Path(found).resolve() == script.resolve()):
        return "onward"
    with contextlib.suppress(ValueError):
        return str(script.relative_to(Path.cwd()))
    return str(script)


def console_hint(settings: OnwardSettings) -> str:
    """How to open the console (API and web page) on the demo's data."""
    env = "" if settings.embedded else "ONWARD_DATABASE_URL=… "
    sign_in = ("it prints a login link with a fresh admin token" if settings.embedded else
               "sign in with a token from `onward tokens create NAME --role operator`")
    return (f"console: {env}{onward_command()} console   (http://127.0.0.1:8765; {sign_in}; "
            "the runs and approvals above are there)")


@dataclass
class Research:
    """What the research batch left for the final report, and the armed sales worker."""
    victim: Run
    stats: BatchStats
    problems: list[str]
    crm2: Proc


def run_demo(runs: int, sales_runs: int, deadline_s: float) -> int:
    queue = f"demo.{secrets.token_hex(4)}"
    env = demo_env(queue)
    os.environ.update({k: v for k, v in env.items() if k.startswith("ONWARD_")})
    settings = OnwardSettings()
    log_dir = settings.home_dir / "demo" / datetime.now().strftime("%Y%m%d-%H%M%S")
    log_dir.mkdir(parents=True, exist_ok=True)
    # The CRM fault fires once per demo: its marker lives with this demo's logs.
    env["ONWARD_FAULTS_DIR"] = str(log_dir / "faults")
    servers(settings)
    upgrade(env)
    ledger = Ledger.from_env(settings)

    fleet = Fleet(env=env, log_dir=log_dir)
    try:
        provider, crm = start_processes(fleet, queue, log_dir)
        batch = f"demo-{secrets.token_hex(3)}"
        sales_ids, held_nothing = park_sales_then_start_research(ledger, fleet, crm,
                                                                  sales_runs, batch)
        research = run_research_batch(ledger, fleet, runs, batch, deadline_s)
        fleet.wait_ready([research.crm2])
        refused = approve_offers(ledger, sales_ids)
        wait_sales_done(ledger, sales_ids, fleet, timeout=deadline_s)
        fleet.remember_pids()
        sales_problems, sales_fields = sales_report(ledger, sales_ids, fleet, provider,
                                                    held_nothing, refused)
    finally:
        fleet.stop_all()
    return finish(settings, fleet, research, sales_problems, sales_fields)


def start_processes(fleet: Fleet, queue: str, log_dir: Path) -> tuple[ReferenceProvider, Proc]:
    """The provider, the model server, a dispatcher, a reaper and the sales worker crm-1."""
    phase("3. processes", f"on queue {queue} (logs in {log_dir})")
    provider = ReferenceProvider.start(fleet, log_dir, timeout=30)
    url = provider.url
    fleet.env["ONWARD_EXAMPLE_PROVIDER_URL"] = url
    model = ModelServer.start(fleet, log_dir, "--latency-ms",
                              MODEL_LATENCY_MS, timeout=30)
    fleet.env["ONWARD_MODEL_URL"] = model.url
    fleet.onward("dispatcher", ["dispatcher"])
    fleet.onward("reaper", ["reaper"])
    crm = fleet.worker("crm-1", env=SALES_ENV)
    fleet.wait_ready([crm])
    for proc in fleet.procs:
        what = {"provider": url, "model": model.url}.get(proc.name, "")
        console.print(f"   {proc.name:<11} pid {proc.pid} {what}".rstrip())
    return provider, crm


def park_sales_then_start_research(ledger: Ledger, fleet: Fleet, crm: Proc, sales_runs: int,
                                   batch: str) -> tuple[list[UUID], bool]:
    """The sales runs wait for approval with no sales worker; research workers start."""
    phase(f"4. starting {sales_runs} runs of {SALES_WORKFLOW}",
          "(classify → draft → approval → CRM offer → email)")
    sales_ids = start_sales_runs(ledger, sales_runs, batch)
    held_nothing = park_sales_runs(ledger, sales_ids, fleet, crm)
    # Research workers import only the research agent: they cannot take a sales step.
    research = [fleet.worker("worker-1"), fleet.worker("worker-2")]
    phase("6. research workers", "starting while the offers wait")
    fleet.wait_ready(research)
    for proc in research:
        console.print(f"   {proc.name:<11} pid {proc.pid}")
    return sales_ids, held_nothing


def run_research_batch(ledger: Ledger, fleet: Fleet, runs: int, batch: str,
                       deadline_s: float) -> Research:
    """The research runs, a worker killed mid-step, crm-2 armed; the killed run's report."""
    phase(f"7. starting {runs} runs of {WORKFLOW}",
          f"(5 steps, 4 model calls each, {MODEL_LATENCY_MS} ms per call)")
    run_ids = [
        ledger.start_run(WORKFLOW, {"topic": f"topic-{i:02d}"}, conversation_id=batch,
                         idempotency_key=f"{batch}:{i}")
        for i in range(runs)
    ]
    victim = kill_mid_step(ledger, run_ids, fleet)
    crm2 = start_armed_sales_worker(ledger, run_ids, fleet)
    wait_all_terminal(ledger, run_ids, fleet, timeout=deadline_s)
    fleet.remember_pids()
    console.print()
    console.print(timeline_table(ledger, victim.id, fleet.pid_names))
    stats = ledger.batch_stats(run_ids)
    lost = count_lost_steps(ledger, run_ids)
    research_problems = report(stats, lost, time.monotonic() - STARTED)
    console.print()
    return Research(victim, stats, research_problems, crm2)


def finish(settings: OnwardSettings, fleet: Fleet, research: Research,
           sales_problems: list[str], sales_fields: dict[str, int]) -> int:
    """The closing lines on stderr, the JSON line on stdout; the exit status."""
    stats = research.stats
    problems = research.problems + sales_problems
    console.print(f"\ndone in {time.monotonic() - STARTED:.1f}s")
    onward = onward_command()
    hint = f"    stop the embedded servers: {onward} embedded down" if settings.embedded else ""
    console.print(f"inspect: {onward} runs show {research.victim.id}{hint}")
    console.print(console_hint(settings))
    console.print(f"replay: {onward} corpus add demo --workflow research_agent --since 1h && "
                  f"{onward} corpus replay demo --code examples.research_v2 --show-sealed   "
                  "(the research runs against version 2 of the agent, offline; you are "
                  "admin, so it shows the sealed prompts' diff; README: regression suite)")
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
        "workers_killed": sum(proc.killed for proc in fleet.workers()),
        **sales_fields,
    }
    print(json.dumps(summary), flush=True)
    return 1 if problems else 0


def _interrupt(signum: int, _frame: object) -> None:
    """SIGTERM takes the same path as Ctrl-C: stop every subprocess, then exit."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=24, help="runs in the batch (default 24)")
    parser.add_argument("--sales-runs", type=int, default=3,
                        help="sales-offer runs (default 3)")
    parser.add_argument("--deadline", type=float, default=90.0,
                        help="seconds to wait for every run to end (default 90)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.sales_runs < 1:
        parser.error("--sales-runs must be at least 1")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in background
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run_demo(args.runs, args.sales_runs, args.deadline)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every demo process was stopped[/yellow]")
        return 130
    except HarnessError as exc:  # DemoFailed, a process that exited, a deadline passed
        console.print(f"[bold red]demo failed:[/bold red] {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
