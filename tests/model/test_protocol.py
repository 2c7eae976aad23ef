"""The step protocol tested as a state machine (docs/design.md section 13, issue 10 item 13).

Hypothesis drives the real ledger (PostgreSQL), the real executor (``execute_step``), two
real ``StepStore``s (two workers with their own connections and ids), the real reaper
(``RecoveryStore.sweep``), the real dispatcher sweep (``OutboxStore.sweep``) and the real
operator commands (``Ledger``) through random interleavings of:

    start a run · deliver a message to worker 0 or 1 (kept in the broker: a duplicate; or
    dropped: a loss) with eager continuation · script the provider's next answer (answers,
    acts and loses the response, refuses, unavailable, hangs: slower than the lease) and
    the model's (billed and lost) · resume a hung call (acted or not, answered, lost, or the
    worker killed) · crash at each named fault point, or after any ledger statement · reaper
    sweep · dispatcher sweep (killed before marking) · time passing · signal · approve,
    reject, expiry · cancel · continue · replay (evidence, simulation, live) · branch ·
    an admin's effects repeat · deploy v2 (a state migration) or roll back to v1 on either
    worker · a quiet stretch after which every run must have settled

and checks every invariant of tests/model/invariants.py after every rule. A worker's crash
is a ``BaseException`` raised where the worker would have been SIGKILLed: nothing in onward
catches it, the lease stays held, and the worker comes back with a new connection and id.

Sizing: the ``model-ci`` profile (default) runs in tens of seconds; ``make soak`` runs the
``model-soak`` profile. ``ONWARD_MODEL_PROFILE``, ``ONWARD_MODEL_EXAMPLES`` and
``ONWARD_MODEL_STEPS`` override the choice.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from collections import Counter, deque
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import (
    PRECONDITIONS_MARKER,
    RULE_MARKER,
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

import tasks.executor
from ledger import Ledger, signed
from ledger.api import REFUSALS
from ledger.checkpoints import CheckpointBody
from ledger.recovery import RecoveryStore
from ledger.runs import Budgets
from ledger.states import checkpoint_rows_txn
from ledger.vocabulary import ApprovalStatus, LaunchMode
from tasks import faults
from tasks.executor import ExecutorConfig
from tasks.operator import plan_repeat, repeat_effect
from tasks.workflow import Registry
from tests.model import flows
from tests.model.harness import (
    LEASE_TTL_S,
    STALL_AFTER_S,
    Broker,
    Clock,
    Crashes,
    Delivery,
    Dispatcher,
    Worker,
    empty_ledger,
)
from tests.model.invariants import Context, RunBook, check_all
from tests.model.world import (
    MODEL_MODES,
    PROVIDER_MODES,
    RESUME_ACTIONS,
    World,
    current_runner,
    install,
)
from workers.settings import WorkerSettings

pytestmark = pytest.mark.model

# Known failures of main are switched off in tests/model/known.py (each names its finding
# and issue item). ONWARD_MODEL_DISABLE=a,b switches whole invariants off by name: for
# looking past a failure while exploring, never in CI.
DISABLED: frozenset[str] = frozenset(
    os.environ.get("ONWARD_MODEL_DISABLE", "").split(",")) - {""}

# no "explain" phase: its line tracing makes every example several times slower
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
hsettings.register_profile(
    "model-ci", max_examples=20, stateful_step_count=40, deadline=None,
    suppress_health_check=list(HealthCheck), print_blob=True, phases=PHASES)
hsettings.register_profile(
    "model-soak", max_examples=1500, stateful_step_count=60, deadline=None,
    suppress_health_check=list(HealthCheck), print_blob=True, phases=PHASES)

BUDGETS = {
    "none": Budgets(),
    "tokens": Budgets(tokens=100),  # a call costs 40 tokens: the third call starts over
    "cost": Budgets(cost_usd=0.01),  # a call costs $0.004
    "deadline": Budgets(deadline=timedelta(seconds=200)),
}
FAULT_POINTS = sorted(faults.POINTS - {"dispatcher_after_publish_before_mark"})
# where a delivery's worker dies: mostly nowhere, else at a named fault point or right after
# the n-th ledger statement of the delivery (a SIGKILL between any two statements)
PLAN = st.lists(st.sampled_from(flows.OPS), min_size=1, max_size=4)
# a wait control a newer onward might write, which this code cannot read
UNREADABLE = {
    "unknown_kind": lambda control: {**control, "kind": "webhook"},
    "no_then": lambda control: {k: v for k, v in control.items() if k != "then"},
}
CRASH = st.one_of(st.none(), st.none(), st.none(), st.sampled_from(FAULT_POINTS),
                  st.integers(1, 8))


def _registry(*workflows: Any) -> Registry:
    registry = Registry()
    for workflow in workflows:
        registry.register(workflow)
    return registry


CODE = {"v1": _registry(flows.flow_v1), "v2": _registry(flows.flow_v2),
        "v1+v2": _registry(flows.flow_v1, flows.flow_v2)}


@dataclass
class Environment:
    """What every example shares: the database, the clock, the crash switch."""

    ledger: Ledger
    clock: Clock
    crashes: Crashes
    config: ExecutorConfig
    checker: psycopg.Connection[Any]
    stats: Counter[str]
    jitter: random.Random  # the executor's retry jitter, reseeded for every example


ENV: Environment | None = None
SETTLE_ROUNDS = 30
SETTLE_TICK_S = 61
SETTLE_DELIVERIES = 50


_VIOLATIONS: dict[str, type[AssertionError]] = {}


def _violation(check: str) -> type[AssertionError]:
    """One exception class per invariant, so hypothesis tells different failures apart and
    reports (and shrinks) each one instead of only the first it met."""
    if check not in _VIOLATIONS:
        _VIOLATIONS[check] = type(f"Violated_{check}", (AssertionError,), {})
    return _VIOLATIONS[check]


def _alias(rule_function: Any, name: str, target: Bundle[Any] | None = None) -> Any:
    """Register a rule a second time (same arguments, precondition and printed name)."""
    existing = getattr(rule_function, RULE_MARKER)

    def alias(self: Any, **kwargs: Any) -> Any:
        return existing.function(self, **kwargs)

    alias.__name__ = name
    setattr(alias, PRECONDITIONS_MARKER, existing.preconditions)
    if target is not None:
        return rule(target=target, **existing.arguments)(alias)
    return rule(**existing.arguments)(alias)


LOCK_TIMEOUT_MS = 20_000


class ProtocolMachine(RuleBasedStateMachine):
    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        assert ENV is not None
        self.env = ENV
        self.env.stats["examples"] += 1
        started = time.perf_counter()
        empty_ledger(self.env.ledger.engine)
        self.env.clock.on_advance.clear()
        self.env.clock.reset()
        self.env.jitter.seed(0)  # hypothesis replays an example only if it behaves the same
        self.env.crashes.point = self.env.crashes.after_statement = None
        self.world = World(on_body=self._on_body)
        self.world.provider.on_call = self._on_call
        self.world.model.on_call = lambda prompt: self._on_call("model", prompt, None)
        self.world.provider.clock_s = lambda: self.env.clock.offset.total_seconds()
        self.env.clock.on_advance[:] = [self.world.provider.expire]
        install(self.world)
        self.ledger = self.env.ledger
        self.broker = Broker()
        url = self.ledger.url
        self.workers = [Worker(i, url, self.ledger.keys, self.env.config, CODE["v1"],
                               self.broker, self.env.crashes, self.env.clock) for i in (0, 1)]
        self.dispatcher = Dispatcher(url, self.broker, self._rank)
        self.reaper = RecoveryStore(self.ledger.engine)
        self.book = RunBook()
        self.worker_errors: list[str] = []
        self.refs = 0
        self.settled = False
        self.env.stats["setup_ms"] += round((time.perf_counter() - started) * 1000)

    # -- helpers ---------------------------------------------------------------------------
    def _on_body(self, ctx: Any) -> None:
        """As a step body starts: its step must not have committed already."""
        row = self.env.checker.execute(
            "SELECT lease_epoch FROM onward.checkpoints WHERE run_id = %s AND seq = %s",
            (ctx.run_id, ctx.seq + 1)).fetchone()
        if row is not None:
            self.world.note("reran", f"run {ctx.run_id}: step {ctx.step} ran from seq "
                            f"{ctx.seq} on {ctx.worker}, after seq {ctx.seq + 1} committed")

    def _on_call(self, collection: str, key: str, timeout: float | None) -> None:
        """As a provider or model call starts: the calling worker holds the run's lease, the
        lease covers the call's time limit, and the run is still running (not cancelled,
        failed or parked)."""
        runner = current_runner()
        if runner is None:
            return  # an operator's repeat
        row = self.env.checker.execute(
            "SELECT lease_owner, status, lease_expires_at - onward.now() AS left_ "
            "FROM onward.runs WHERE id = %s", (runner.run_id,)).fetchone()
        owner, status, left = row if row is not None else (None, None, None)
        needed = timedelta(seconds=timeout or 0)
        if owner != runner.name or status != "running" or left is None \
                or left <= needed:
            self.world.note("unleased_call", f"{runner.name} called {collection} (key "
                            f"{key[:12]}…) for run {runner.run_id} while the run is {status} "
                            f"with lease {owner!r}, {left} left (the call may take {needed})")

    def _worker(self, index: int, state: str) -> Worker:
        candidates = [w for w in self.workers if getattr(w, state)]
        return candidates[index % len(candidates)]

    def _record(self, worker: Worker, delivery: Delivery) -> None:
        self.env.stats[f"delivery_{delivery.state}"] += 1
        if delivery.state == "suspended":
            return
        self.env.crashes.point = self.env.crashes.after_statement = None
        self.env.stats["steps"] += len(delivery.reports)
        for report in delivery.reports:
            self.env.stats[f"report_{report.kind.value}"] += 1
        if delivery.state == "error":
            error = delivery.error
            self.worker_errors.append(f"{worker.name}: {type(error).__name__}: {error}")

    def _rank(self, run_id: UUID) -> int:
        """Runs in the order the test created them (a stable order for ties)."""
        return self.book.order.get(run_id, len(self.book.order))

    def _book(self, run_id: UUID) -> None:
        self.book.order[run_id] = len(self.book.order)
        run = self.ledger.get_run(run_id)
        assert run is not None
        self.book.started_tokens[run_id] = run.used_tokens
        self.book.started_cost[run_id] = Decimal(run.used_cost_usd)

    def _fork_seq(self, run_id: UUID, pick: int) -> int | None:
        seqs = [row[0] for row in self.env.checker.execute(
            "SELECT seq FROM onward.checkpoints WHERE run_id = %s ORDER BY seq", (run_id,))]
        return seqs[pick % len(seqs)] if seqs else None

    # -- rules: runs and messages -------------------------------------------------------------
    @initialize(target=runs, ops=PLAN, budget=st.sampled_from(sorted(BUDGETS)))
    def first_run(self, ops: list[str], budget: str) -> UUID:
        return self.start(ops, budget)

    @rule(target=runs, ops=PLAN, budget=st.sampled_from(sorted(BUDGETS)))
    def start(self, ops: list[str], budget: str) -> UUID:
        self.refs += 1
        run_id = self.ledger.start_run("model_flow", {"ref": f"r{self.refs}", "ops": ops},
                                       budgets=BUDGETS[budget], max_attempts=3)
        self._book(run_id)
        self.env.stats["runs"] += 1
        return run_id

    @precondition(lambda self: self.refs > 0 and any(w.idle for w in self.workers))
    @rule(worker=st.integers(0, 1), pick=st.integers(0, 63), keep=st.booleans(),
          eager=st.sampled_from([0, 0, 1, 4]),
          provider=st.lists(st.sampled_from(PROVIDER_MODES), max_size=2),
          model=st.sampled_from(["answer", "answer", "answer", *MODEL_MODES[1:]]),
          crash=CRASH)
    def deliver(self, worker: int, pick: int, keep: bool, eager: int, provider: list[str],
                model: str, crash: str | int | None) -> None:
        """Deliver one message (``keep``: it stays in the broker, a duplicate) to a worker;
        with the broker empty, the dispatcher sweeps first. ``provider`` scripts the
        provider's next answers in this delivery, ``model`` the model's first one,
        ``crash`` where the worker dies (a fault point, or after the n-th statement)."""
        if not self.broker.messages:
            self.dispatcher.sweep(crash_before_mark=False)
        if not self.broker.messages:
            return
        chosen = self._worker(worker, "idle")
        self.world.provider.script = deque(provider)
        self.world.model.script = deque([model])
        self.env.crashes.point = crash if isinstance(crash, str) else None
        self.env.crashes.after_statement = crash if isinstance(crash, int) else None
        self._record(chosen, chosen.deliver(self.broker.take(pick, keep), eager))

    @precondition(lambda self: self.refs > 0)
    @rule(messages=st.integers(1, 6))
    def fleet_works(self, messages: int) -> None:
        """A quiet stretch: the dispatcher sweeps, idle workers take messages in order, the
        provider and the model answer, nobody crashes."""
        self.env.stats["rule_fleet_works"] += 1
        for _ in range(messages):
            if not self.broker.messages:
                self.env.stats["fleet_sweeps"] += 1
                self.env.stats["fleet_swept"] += self.dispatcher.sweep(crash_before_mark=False)
            idle = [w for w in self.workers if w.idle]
            if not self.broker.messages or not idle:
                return
            self.world.provider.script.clear()
            self.world.model.script.clear()
            self.env.crashes.point = self.env.crashes.after_statement = None
            self._record(idle[0], idle[0].deliver(self.broker.take(0, keep=False), 0))

    @precondition(lambda self: self.broker.messages)
    @rule(pick=st.integers(0, 63))
    def lose_message(self, pick: int) -> None:
        self.broker.take(pick, keep=False)

    @precondition(lambda self: any(w.suspended for w in self.workers)
                  and any(w.idle for w in self.workers))
    @rule(provider=st.lists(st.sampled_from(PROVIDER_MODES[:-1]), max_size=2))
    def lease_expires_under_a_hung_call(self, provider: list[str]) -> None:
        """A call slower than the lease: the lease expires, the reaper gives the step back,
        and the other worker runs it while the first one still waits for the provider."""
        hung = self._worker(0, "suspended")
        other = self._worker(0, "idle")
        left = self.env.checker.execute(
            "SELECT extract(epoch FROM lease_expires_at - onward.now()) FROM onward.runs "
            "WHERE id = %s", (hung.run_id,)).fetchone()
        # whole seconds: a real-time fraction would make the example replay differently
        self.env.clock.advance(math.ceil(max(float(left[0] or 0) if left else 0,
                                             LEASE_TTL_S)) + 1)
        self.reaper.sweep(stall_after_s=STALL_AFTER_S)
        self.dispatcher.sweep(crash_before_mark=False)
        self.world.provider.script = deque(provider)
        mine = [i for i, m in enumerate(self.broker.messages) if m[0] == hung.run_id]
        for index in reversed(mine):
            if not other.idle:
                return
            self._record(other, other.deliver(self.broker.messages.pop(index), 0))

    @precondition(lambda self: any(w.suspended for w in self.workers))
    @rule(worker=st.integers(0, 1), action=st.sampled_from(RESUME_ACTIONS))
    def resume_call(self, worker: int, action: str) -> None:
        """End a hung provider call: acted or not, answered, lost, or its worker killed."""
        chosen = self._worker(worker, "suspended")
        self._record(chosen, chosen.resume(action))

    # -- rules: the fleet's background processes and time ------------------------------------
    @rule()
    def reaper_sweep(self) -> None:
        self.reaper.sweep(stall_after_s=STALL_AFTER_S)

    @rule(crash_before_mark=st.booleans())
    def dispatcher_sweep(self, crash_before_mark: bool) -> None:
        self.dispatcher.sweep(crash_before_mark)

    @rule(seconds=st.sampled_from([1, 11, 31, 61, 121, 301]))
    def time_passes(self, seconds: int) -> None:
        self.env.clock.advance(seconds)

    @precondition(lambda self: any(w.idle for w in self.workers))
    @rule(worker=st.integers(0, 1), code=st.sampled_from(sorted(CODE)))
    def deploy(self, worker: int, code: str) -> None:
        """Restart an idle worker with other code: v2 migrates schema-1 runs; v1 after v2 is
        a rollback."""
        chosen = self._worker(worker, "idle")
        chosen.registry = CODE[code]
        chosen.restart()  # and advertises its code

    # -- rules: people ---------------------------------------------------------------------------
    @rule(run=runs, payload=st.integers(0, 3))
    def signal(self, run: UUID, payload: int) -> None:
        with contextlib.suppress(*REFUSALS):
            self.ledger.signal(run, "go", {"n": payload})

    @rule(pick=st.integers(0, 15), approve=st.booleans())
    def decide(self, pick: int, approve: bool) -> None:
        pending = sorted(self.ledger.approvals(status=ApprovalStatus.PENDING),
                         key=lambda a: (self._rank(a.run_id), a.seq))
        if not pending:
            return
        approval = pending[pick % len(pending)]
        decide = self.ledger.approve if approve else self.ledger.reject
        with contextlib.suppress(*REFUSALS):
            decide(approval.id, artifact_hash=approval.artifact_hash, comment="model test")

    @rule(pick=st.integers(0, 15), twice=st.booleans())
    def person_repeats_effect(self, pick: int, twice: bool) -> None:
        """An admin repeats an external effect (its objects are a person's decision, under a
        key of their own); confirming the same plan a second time is refused (two admins
        confirming one plan make one repeat); a simulation's effect goes to the sandbox."""
        effects = sorted(self.ledger.find_effects(limit=500),
                         key=lambda e: (self._rank(e.run_id), e.seq, e.command_id))
        if not effects:
            return
        effect = effects[pick % len(effects)]
        plan = plan_repeat(self.ledger, effect)
        real_before = len(self.world.provider.objects)
        with self.world.provider.as_person():
            try:
                repeat_effect(self.ledger, plan, "model test: repeat")
            except REFUSALS:
                return
            self.env.stats["repeats"] += 1
            if twice:
                with contextlib.suppress(*REFUSALS):
                    repeat_effect(self.ledger, plan, "model test: the same plan again")
                    self.world.note("repeat", f"effect {effect.effect_type} "
                                    f"{effect.effect_id[:16]}…: a second confirmation of the "
                                    "same plan repeated it again")
        if plan.run_mode in ("simulation", "evidence") \
                and len(self.world.provider.objects) > real_before:
            self.world.note("repeat", f"effect {effect.effect_id[:16]}… of a {plan.run_mode} "
                            "run was repeated at the real provider")

    @precondition(lambda self: self.refs > 0)
    @rule(pick=st.integers(0, 15), how=st.sampled_from(sorted(UNREADABLE)),
          signal_now=st.booleans())
    def newer_control(self, pick: int, how: str, signal_now: bool) -> None:
        """A newer onward wrote the head of a run that waits, or whose wait just ended (an
        approval's, a signal's or a timer's; no worker holds it): its wait control is one
        this code cannot read (an unknown kind, or no ``then``), signed as a commit signs
        it (the checkpoint's MAC, the run's head hash and head MAC). The run must park
        ``invalid_control`` whatever ends the wait, never run its step on a guess
        (``unreadable_control_parks``). ``signal_now``: the signal a signal wait waits
        for is sent at once, so a worker's claim meets the control (not only the
        reaper's timeout)."""
        waiting = sorted(self.env.checker.execute(  # a timer's run is running, unleased
            "SELECT r.id, r.seq FROM onward.runs r JOIN onward.checkpoints c "
            "ON c.run_id = r.id AND c.seq = r.seq WHERE r.status IN ('waiting', 'running') "
            "AND r.lease_owner IS NULL AND c.outcome = 'wait'").fetchall(),
            key=lambda row: self._rank(row[0]))
        if not waiting:
            return
        run_id, seq = waiting[pick % len(waiting)]
        with self.ledger.engine.begin() as conn:
            conn.execute(sa.text("SELECT 1 FROM onward.runs WHERE id = :r FOR UPDATE"),
                         {"r": run_id})
            row = checkpoint_rows_txn(conn, run_id, upto=seq)[-1]  # with its chain digest
            row["control"] = UNREADABLE[how](dict(row["control"] or {}))
            digest = self.ledger.keys.mac(CheckpointBody.from_row(row).as_dict())
            conn.execute(sa.text(
                "UPDATE onward.checkpoints SET control = CAST(:c AS jsonb), hash = :h "
                "WHERE run_id = :r AND seq = :s"),
                {"c": json.dumps(row["control"]), "h": digest, "r": run_id, "s": seq})
            conn.execute(sa.text(
                "UPDATE onward.runs SET head_hash = :h, head_mac = :m WHERE id = :r"),
                {"h": digest, "m": self.ledger.keys.sign(signed.head(run_id, seq, digest)),
                 "r": run_id})
        self.book.unreadable[run_id] = seq
        self.env.stats["unreadable_controls"] += 1
        waiting_on = self.ledger.get_run(run_id).waiting_on or ""
        if signal_now and waiting_on.startswith("signal:"):
            with contextlib.suppress(*REFUSALS):
                self.ledger.signal(run_id, waiting_on.removeprefix("signal:"), {"n": 9})
                self.env.stats["unreadable_signalled"] += 1

    @rule(run=runs)
    def cancel(self, run: UUID) -> None:
        with contextlib.suppress(*REFUSALS):
            self.ledger.cancel(run, "model test: cancel")

    @rule(run=runs)
    def continue_run(self, run: UUID) -> None:
        before = self.ledger.get_run(run)
        with contextlib.suppress(*REFUSALS):
            self.ledger.continue_run(run, "model test: continue")
            if before is not None and (before.last_error or {}).get("reason") == "invalid_answer":
                self.world.model.reasked[run] += 1  # docs/operating.md: continue asks again

    @rule(target=runs, run=runs, pick=st.integers(0, 15),
          mode=st.sampled_from([m.value for m in (LaunchMode.EVIDENCE, LaunchMode.SIMULATION,
                                                  LaunchMode.LIVE)]),
          allow_irreversible=st.booleans(), reset=st.booleans())
    def replay(self, run: UUID, pick: int, mode: str, allow_irreversible: bool,
               reset: bool) -> Any:
        seq = self._fork_seq(run, pick)
        if seq is None:
            return multiple()
        try:
            launched = self.ledger.replay(
                run, seq, mode, "model test: replay", budgets="reset" if reset else "inherited",
                allow_irreversible=allow_irreversible and mode == LaunchMode.LIVE.value)
        except REFUSALS:
            return multiple()
        self._book(launched.run_id)
        self.env.stats["replays"] += 1
        return launched.run_id

    @rule(target=runs, run=runs, pick=st.integers(0, 15), allow_irreversible=st.booleans())
    def branch(self, run: UUID, pick: int, allow_irreversible: bool) -> Any:
        seq = self._fork_seq(run, pick)
        if seq is None:
            return multiple()
        try:
            launched = self.ledger.branch(
                run, seq, [{"op": "replace", "path": "/tag", "value": f"branch of {seq}"}],
                "model test: branch", allow_irreversible=allow_irreversible)
        except REFUSALS:
            return multiple()
        self._book(launched.run_id)
        self.env.stats["branches"] += 1
        return launched.run_id

    @precondition(lambda self: not self.settled)
    @rule()
    def everything_settles(self) -> None:
        """Liveness: with no more crashes or faults, and time passing, every run ends
        (terminal or parked) within a bounded number of rounds of the fleet's ordinary work,
        on the code deployed now: nothing bounces, waits or is re-sent forever."""
        self.env.stats["settles"] += 1
        self.settled = True  # once per example: it ends every run, so little follows it
        for _ in range(SETTLE_ROUNDS):
            self._quiet_round()
            if not self._unsettled():
                return
            self.env.clock.advance(SETTLE_TICK_S)
        unsettled = "\n    ".join(self._unsettled())
        raise _violation("everything_settles")(
            f"runs still unsettled after {SETTLE_ROUNDS} quiet rounds "
            f"({SETTLE_TICK_S}s apart):\n    {unsettled}")

    def _quiet_round(self) -> None:
        """The fleet's ordinary work: calls end (answered in time), sweeps, deliveries."""
        self.world.provider.script.clear()
        self.world.model.script.clear()
        self.env.crashes.point = self.env.crashes.after_statement = None
        for worker in self.workers:
            self._finish_calls(worker)
        self.reaper.sweep(stall_after_s=STALL_AFTER_S)
        self.dispatcher.sweep(crash_before_mark=False)
        for n in range(SETTLE_DELIVERIES):
            if not self.broker.messages:
                break
            worker = self.workers[n % len(self.workers)]
            self._record(worker, worker.deliver(self.broker.take(0, keep=False), 0))
            self._finish_calls(worker)

    def _finish_calls(self, worker: Worker) -> None:
        while worker.suspended:
            self._record(worker, worker.resume("act_answer"))

    def _unsettled(self) -> list[str]:
        rows = self.env.checker.execute(
            "SELECT id, status, seq, step, waiting_on, last_error->>'message' FROM onward.runs "
            "WHERE status IN ('running', 'waiting') ORDER BY id").fetchall()
        return [f"run {r[0]} {r[1]} at seq {r[2]} step {r[3]} (waiting_on {r[4]}; last "
                f"error {r[5]})" for r in rows]

    # -- weights: hypothesis picks among enabled rules uniformly, so the rules that make
    # progress are listed more than once (the copies print under the same name)
    start_2 = _alias(start, "start", target=runs)
    deliver_2 = _alias(deliver, "deliver")
    deliver_3 = _alias(deliver, "deliver")
    dispatcher_sweep_2 = _alias(dispatcher_sweep, "dispatcher_sweep")

    # -- the invariants --------------------------------------------------------------------------
    @invariant()
    def protocol_invariants(self) -> None:
        self.env.stats["checks"] += 1
        started = time.perf_counter()
        with self.ledger.engine.connect() as conn:
            found = check_all(Context(conn, self.ledger, self.world, self.book,
                                      self.worker_errors), DISABLED, self.env.stats)
        self.env.stats["check_ms"] += round((time.perf_counter() - started) * 1000)
        if found:
            lines = [f"{name}:\n    " + "\n    ".join(items) for name, items in found.items()]
            raise _violation(next(iter(found)))("invariants violated:\n" + "\n".join(lines))

    def teardown(self) -> None:
        for worker in self.workers:
            while worker.suspended:
                worker.resume("no_act_crash")
            worker.store.close()
        self.dispatcher.close()
        self.env.stats["provider_objects"] += len(self.world.provider.objects)
        self.env.stats["model_calls"] += sum(self.world.model.calls.values())


def _profile() -> hsettings:
    chosen = hsettings.get_profile(os.environ.get("ONWARD_MODEL_PROFILE", "model-ci"))
    overrides: dict[str, Any] = {}
    if os.environ.get("ONWARD_MODEL_EXAMPLES"):
        overrides["max_examples"] = int(os.environ["ONWARD_MODEL_EXAMPLES"])
    if os.environ.get("ONWARD_MODEL_STEPS"):
        overrides["stateful_step_count"] = int(os.environ["ONWARD_MODEL_STEPS"])
    return hsettings(chosen, **overrides)


def test_protocol__invariants_hold_under_random_interleavings(
        settings: WorkerSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every invariant of docs/design.md section 13 (tests/model/invariants.py) holds after every
    rule of every interleaving hypothesis explores, against the real ledger and executor."""
    global ENV
    # one thread runs at a time: a lock wait can only be a bug, so make it an error
    # (and no fsync wait per commit: the server's durability is not what is tested here)
    monkeypatch.setenv("PGOPTIONS", f"-c lock_timeout={LOCK_TIMEOUT_MS} "
                                    "-c synchronous_commit=off")
    # trusted code: an admin of the settings' tenant; the flows module is where `effects
    # repeat` finds the model test's tools
    settings = settings.model_copy(update={"workflows": [*settings.workflows,
                                                         "tests.model.flows"]})
    ledger = Ledger.from_env(settings)
    clock = Clock()
    clock.follow(ledger.engine)
    clock.install(monkeypatch)
    crashes = Crashes()
    config = ExecutorConfig(keys=ledger.keys, max_state_bytes=settings.max_state_bytes,
                            retry_base_s=1.0, retry_max_s=10.0)
    checker = clock.connect_raw(ledger.url)  # the test's own reads, on the ledger's clock
    stats: Counter[str] = Counter()
    jitter = random.Random(0)
    # other threads (psycopg_pool's) draw from the global generator at times of their own
    monkeypatch.setattr(tasks.executor, "random", jitter)
    ENV = Environment(ledger, clock, crashes, config, checker, stats, jitter)
    started = time.monotonic()
    try:
        with crashes.installed():
            run_state_machine_as_test(ProtocolMachine, settings=_profile())
    finally:
        ENV = None
        checker.close()
        ledger.engine.dispose()
        print(f"\nmodel test: {dict(sorted(stats.items()))} in "
              f"{time.monotonic() - started:.1f}s")
