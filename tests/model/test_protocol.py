"""The step protocol tested as a state machine (docs/design.md section 13, issue 10 item 13).

Hypothesis drives the real ledger (PostgreSQL), the real executor (``execute_step``), two
real ``StepStore``s (two workers with their own connections and ids), the real reaper
(``RecoveryStore.sweep``), the real dispatcher sweep (``OutboxStore.sweep``) and the real
operator commands (``Ledger``) through random interleavings of:

    start a run · deliver a message to worker 0 or 1 (kept in the broker: a duplicate; or
    dropped: a loss) with eager continuation · script the provider's next answer (answers,
    acts and loses the response, refuses, unavailable, hangs: slower than the lease) and the
    model's (billed and lost) · an async step making two effect calls at once · resume a
    hung call (acted or not, answered, lost, or the worker killed) · crash at each named
    fault point, or after any ledger statement · reaper sweep · dispatcher sweep (killed
    before marking) · time passing · signal · approve, reject, expiry · cancel · continue
    (and continue of a run whose head is a wait) · a run at a wait made runnable in the
    database (tests/model/wait_edits.py) · replay (evidence, simulation, live) · branch · a
    live replay or branch beside an effect not resolved yet (tests/model/forks.py) · an
    admin's effects repeat · deploy v2 (a state migration) or roll back to v1 on either
    worker · a retry whose body takes another path (tests/model/interleavings.py) · a worker
    stopped at a named fault point while people act on its run, then on or killed · an
    admin's effects resolve · signed rows edited in SQL without the key
    (tests/model/tampering.py) · a quiet stretch after which every run must have settled

and checks every invariant of tests/model/invariants.py after every rule. A worker's crash
is a ``BaseException`` raised where the worker would have been SIGKILLed: nothing in onward
catches it, the lease stays held, and the worker comes back with a new connection and id.

Sizing: the ``model-ci`` profile (default) runs in tens of seconds; ``make soak`` runs the
``model-soak`` profile. ``ONWARD_MODEL_PROFILE``, ``ONWARD_MODEL_EXAMPLES`` and
``ONWARD_MODEL_STEPS`` override the choice.

Replaying a run: the ``model-ci`` profile draws its examples from a seed of its own, chosen
at random and printed with the test's summary and any failure (``ONWARD_MODEL_SEED=<seed>``
replays that run, example for example: the model's time is the only time, harness.Clock).
The soak keeps hypothesis's database of examples instead (``.hypothesis/``: a failure it
found is tried first next time) unless ``ONWARD_MODEL_SEED`` is given; either prints a
failure's shrunk example as ``@reproduce_failure`` too.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import secrets
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, seed
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
from pydantic import SecretStr

import tasks.executor
from harness.databases import create_database
from ledger import Ledger, partitions, retention, signed
from ledger.api import REFUSALS
from ledger.bundle import read_bundle
from ledger.checkpoints import CheckpointBody
from ledger.corpora import Corpora
from ledger.corpus import Selection
from ledger.exceptions import IntegrityViolation
from ledger.recovery import RecoveryStore
from ledger.runs import Budgets
from ledger.states import checkpoint_rows_txn
from ledger.vocabulary import ApprovalStatus
from tasks import faults
from tasks.executor import ExecutorConfig
from tasks.operator import plan_repeat, repeat_effect
from tasks.workflow import Registry
from tests.model import conditions, flows
from tests.model.forks import Forks
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
from tests.model.interleavings import Interleavings
from tests.model.invariants import CANARY, Context, RunBook, check_all, keep_fingerprints
from tests.model.invariants import UNREADABLE as UNREADABLE_CONTROL
from tests.model.tampering import Tampering
from tests.model.wait_edits import WaitEdits
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
# (ONWARD_MODEL_NO_SHRINK=1: a failure is reported as found, unshrunk: for exploring)
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target,
          *([] if os.environ.get("ONWARD_MODEL_NO_SHRINK") else [Phase.shrink])]
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
# retention: policies making every finished run due at once (per kind, or every kind), or
# a day after it finished (only months_pass reaches it: margins of days, never of the real
# seconds a run of the test takes, keep examples replayable); for a partition drop, after the
# months_pass rule moves the clock RETENTION_MONTH_DAYS ahead, also 30 days (due) and 40
# (not yet), or no policy for attempts (kept forever)
COMPACT_POLICIES = ["*/*=0", "*/*:states=0", "*/*:evidence=0", "*/*:artifacts=0",
                    "*/*:attempts=0", "*/model_flow=1"]
EXPIRE_POLICIES = ["*/*=0", "*/*:attempts=30", "*/*:attempts=40", "*/*:states=0"]
RETENTION_MONTH_DAYS = 35
# a person keeps a run from retention while the pass is planned: after it planned (stale
# plan, a compaction) or after it listed the partitions (a drop)
RACES = [None, "hold", "pin"]
MASTER_KEY = secrets.token_hex(32)

# ``stall:<point>``: the worker stops at that fault point (a long pause, a SIGSTOP) until a
# later rule resumes it (on, or killed there), while people and the fleet go on
STALLS = [f"stall:{point}" for point in FAULT_POINTS]
CRASH = st.one_of(st.none(), st.none(), st.none(), st.sampled_from(FAULT_POINTS),
                  st.sampled_from(STALLS), st.integers(1, 8))


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
    sealed: Ledger  # the same ledger with encryption keys (an example chooses: first_run)
    sealed_config: ExecutorConfig
    target: Ledger  # a second ledger, corpus bundles are imported into (and with keys)
    target_sealed: Ledger
    # what an example left behind that the next one must undo (a partition dropped, rows
    # imported into the second ledger)
    dirty: set[str] = field(default_factory=set)


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


def _reset_partitions(engine: sa.engine.Engine) -> None:
    """After an example moved the clock months ahead: this month's partitions are made again
    (if that example dropped them), and those it made for later months go (empty now: the
    rows were deleted; dropped as the owner), so partitions do not pile up over the
    examples."""
    partitions.ensure(engine)
    with engine.begin() as conn:
        now = conn.execute(sa.text("SELECT onward.now()")).scalar_one()
        horizon = now + timedelta(days=31 * (partitions.MONTHS_AHEAD + 1))
        for table in partitions.PARTITIONED:
            for part in partitions.partitions_txn(conn, table):
                if part.lo is not None and part.lo > horizon:  # (drop_partition keeps
                    conn.execute(sa.text(f'DROP TABLE onward."{part.name}"'))  # future ones)


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


class ProtocolMachine(Forks, WaitEdits, Tampering, Interleavings, RuleBasedStateMachine):
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
        self.env.crashes.clear()
        if "partitions" in self.env.dirty:
            _reset_partitions(self.env.ledger.engine)
        if "target" in self.env.dirty:
            empty_ledger(self.env.target.engine)
        self.env.dirty.clear()
        for keyed in (self.env.sealed, self.env.target_sealed):
            assert keyed.keys.crypt is not None
            keyed.keys.crypt.forget()  # the data keys went with the rows
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
        self.exports = 0
        self.settled = False
        self.env.stats["setup_ms"] += round((time.perf_counter() - started) * 1000)

    # -- helpers ---------------------------------------------------------------------------
    def _on_body(self, ctx: Any) -> None:
        """As a step body starts: its step must not have committed already."""
        if ctx.step == "pair":
            self.env.stats["async_bodies"] += 1
        row = self.env.checker.execute(
            "SELECT c.lease_epoch, r.lease_owner FROM onward.checkpoints c JOIN onward.runs r "
            "ON r.id = c.run_id WHERE c.run_id = %s AND c.seq = %s",
            (ctx.run_id, ctx.seq + 1)).fetchone()
        if row is not None and row[1] != ctx.worker:
            # a worker stopped (stall:in_step) past its lease, resumed after another worker
            # committed the step: the body's code runs (at least once, docs/guarantees.md),
            # its calls and its commit are fenced (calls_under_a_live_lease, one commit)
            self.env.stats["body_after_lease_lost"] += 1
        elif row is not None:
            self.world.note("reran", f"run {ctx.run_id}: step {ctx.step} ran from seq "
                            f"{ctx.seq} on {ctx.worker}, after seq {ctx.seq + 1} committed")
        self._event_check(ctx)

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
        self.env.crashes.clear()
        self.env.stats["steps"] += len(delivery.reports)
        for report in delivery.reports:
            self.env.stats[f"report_{report.kind.value}"] += 1
        if delivery.state == "error":
            error = delivery.error
            self.worker_errors.append(f"{worker.name}: {type(error).__name__}: {error}")

    def _arm(self, crash: str | int | None) -> None:
        """Where the next delivery's worker dies (a fault point, after the n-th statement) or
        stops (``stall:<point>``)."""
        self.env.crashes.clear()
        if isinstance(crash, int):
            self.env.crashes.after_statement = crash
        elif crash is not None and crash.startswith("stall:"):
            self.env.crashes.stall = crash.removeprefix("stall:")
        else:
            self.env.crashes.point = crash

    def _rank(self, run_id: UUID) -> int:
        """Runs in the order the test created them (a stable order for ties)."""
        return self.book.order.get(run_id, len(self.book.order))

    def _book(self, run_id: UUID, note: str) -> None:
        self.book.order[run_id] = len(self.book.order)
        self.book.notes[run_id] = note
        run = self.ledger.get_run(run_id)
        assert run is not None
        self.book.started_tokens[run_id] = run.used_tokens
        self.book.started_cost[run_id] = Decimal(run.used_cost_usd)

    # -- rules: runs and messages -------------------------------------------------------------
    @initialize(target=runs, ops=PLAN, budget=st.sampled_from(sorted(BUDGETS)),
                sealed=st.booleans())
    def first_run(self, ops: list[str], budget: str, sealed: bool) -> Any:
        """The example's first run; ``sealed``: the whole example runs with encryption keys
        configured (the ledger, the workers), its sensitive values sealed at rest."""
        if sealed:
            self.book.sealed = True
            self.ledger = self.env.sealed
            for worker in self.workers:
                worker.use_keys(self.env.sealed.keys, self.env.sealed_config)
            self.env.stats["sealed_examples"] += 1
        return self.start(ops, budget)

    @rule(target=runs, ops=PLAN, budget=st.sampled_from(sorted(BUDGETS)))
    def start(self, ops: list[str], budget: str) -> Any:
        self.refs += 1
        ref = f"r{self.refs}"
        note = f"{CANARY}{ref}"
        try:
            run_id = self.ledger.start_run("model_flow", {"ref": ref, "ops": ops, "note": note},
                                           budgets=BUDGETS[budget], max_attempts=3)
        except REFUSALS:
            if not self.book.erased:
                raise
            return multiple()  # nothing more is sealed for a tenant whose keys were erased
        self._book(run_id, note)
        self.env.stats["runs"] += 1
        return run_id

    @precondition(conditions.idle_worker_and_refs)
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
        self._arm(crash)
        self._record(chosen, chosen.deliver(self.broker.take(pick, keep), eager))

    @precondition(conditions.has_refs)
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
            self.env.crashes.clear()
            self._record(idle[0], idle[0].deliver(self.broker.take(0, keep=False), 0))

    @precondition(conditions.has_messages)
    @rule(pick=st.integers(0, 63))
    def lose_message(self, pick: int) -> None:
        self.broker.take(pick, keep=False)

    @precondition(conditions.suspended_and_idle)
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

    @precondition(conditions.suspended_worker)
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

    @precondition(conditions.idle_worker)
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
            self.ledger.signal(run, "go", {"n": payload, "note": self.book.notes[run]})

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
            self.book.decisions[approval.id] = "approved" if approve else "rejected"

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

    @precondition(conditions.has_refs)
    @rule(pick=st.integers(0, 15), how=st.sampled_from(sorted(UNREADABLE)),
          signal_now=st.booleans())
    def newer_control(self, pick: int, how: str, signal_now: bool) -> None:
        """A newer onward wrote the head of a run that waits, or whose wait just ended (an
        approval's, a signal's or a timer's; no worker holds it or is stopped inside its
        step, ``conditions.no_worker_inside``): its wait control is one
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
        # (it signs the head as it stands: never over an edit made without the key)
        waiting = [row for row in waiting if row[0] not in self.book.tampered
                   and conditions.no_worker_inside(self, row[0])]
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
        run = self.ledger.get_run(run_id)
        assert run is not None
        waiting_on = run.waiting_on or ""
        if signal_now and waiting_on.startswith("signal:"):
            with contextlib.suppress(*REFUSALS):
                self.ledger.signal(run_id, waiting_on.removeprefix("signal:"),
                                   {"n": 9, "note": self.book.notes[run_id]})
                self.env.stats["unreadable_signalled"] += 1

    @rule(run=runs)
    def cancel(self, run: UUID) -> None:
        with contextlib.suppress(*REFUSALS):
            self.ledger.cancel(run, "model test: cancel")

    @rule(run=runs)
    def continue_run(self, run: UUID) -> None:
        self._continue(run)

    def _continue(self, run: UUID) -> bool:
        """``onward runs continue``; False if refused. An edited run continued is back on
        its wait (or past it, on its event): no longer an edited one."""
        before = self.ledger.get_run(run)
        try:
            self.ledger.continue_run(run, "model test: continue")
        except REFUSALS:
            return False
        if before is not None and (before.last_error or {}).get("reason") == "invalid_answer":
            self.world.model.reasked[run] += 1  # docs/operating.md: continue asks again
        self.book.edited.pop(run, None)
        return True

    # -- rules: retention, corpus bundles, encryption keys ------------------------------------
    @precondition(conditions.has_refs)
    @rule(run=runs, how=st.sampled_from(["hold", "release", "pin", "unpin"]))
    def keep(self, run: UUID, how: str) -> None:
        """A person keeps a run from retention (a legal hold, a pin in a corpus) or lets it
        go again (``kept_runs_untouched``)."""
        with contextlib.suppress(*REFUSALS):
            self._keep(run, how)

    def _keep(self, run: UUID, how: str) -> None:
        self.book.keeping = True
        if how in ("hold", "release"):
            self.ledger.hold(run, "model test: litigation", release=how == "release")
        elif how == "pin":
            Corpora(self.ledger).add("keep", Selection(run_ids=(run,)))
        else:
            Corpora(self.ledger).remove("keep", (run,), reason="model test")
        self.env.stats[f"keep_{how}"] += 1

    @contextlib.contextmanager
    def _racing(self, module: Any, name: str, race: str | None, pick: int,
                victims: Any) -> Iterator[None]:
        """While the body runs, ``module.name`` (a retention pass's planning read) is
        followed, once, by a person holding or pinning one of the runs ``victims`` picks
        from its answer: the pass then acts on a plan made before the hold or pin."""
        original = getattr(module, name)
        if race is None:
            yield
            return

        done: list[bool] = []

        def raced(*args: Any, **kwargs: Any) -> Any:
            answer = original(*args, **kwargs)
            found = sorted(victims(answer), key=self._rank)
            if found and not done:
                done.append(True)
                with contextlib.suppress(*REFUSALS):
                    self._keep(found[pick % len(found)], race)
                    self.env.stats[f"race_{race}"] += 1
                with self.ledger.engine.connect() as conn:  # what it keeps, from now on
                    self.book.kept.update(keep_fingerprints(conn))
            return answer

        setattr(module, name, raced)
        try:
            yield
        finally:
            setattr(module, name, original)

    def _retention_view(self) -> dict[UUID, Any]:
        """Each run: status, seconds since it finished, step attempts, a child going."""
        return {row[0]: row[1:] for row in self.env.checker.execute(
            "SELECT r.id, r.status, r.tenant_id, r.workflow, "
            "       extract(epoch FROM onward.now() - r.finished_at), "
            "       (SELECT count(*) FROM onward.step_attempts a WHERE a.run_id = r.id), "
            "       EXISTS (SELECT 1 FROM onward.runs c WHERE c.parent_run_id = r.id "
            "               AND c.status NOT IN ('completed', 'failed', 'cancelled')) "
            "  FROM onward.runs r")}

    def _due(self, view: Any, policies: list[retention.Policy], kind: retention.Kind, *,
             children: bool = True) -> str:
        """Why a run whose ``view`` is this is not due for ``kind`` ('' if it is); a child
        still going keeps it from compaction (``children``), not its month's attempts."""
        status, tenant, workflow, age, _attempts, going = view
        days = retention.days_for(policies, tenant, workflow, kind)
        if status not in retention.TERMINAL:
            return f"it is {status}"
        if days is None or age is None or float(age) < days * 86400:
            return f"it finished {age}s ago, its policy keeps {kind.value} {days} days"
        if going and children:
            return "a replay or branch of it is still going"
        return ""

    @precondition(conditions.has_refs)
    @rule(policy=st.sampled_from(COMPACT_POLICIES), race=st.sampled_from(RACES),
          pick=st.integers(0, 15), work=st.booleans())
    def compact(self, policy: str, race: str | None, pick: int, work: bool) -> None:
        """The reaper's retention pass compacts what ``policy`` makes due (``work``: after a
        round of the fleet's ordinary work, so that runs have finished); ``race``: a person
        holds or pins one of the due runs after the pass planned, before it compacts. Each
        run it compacts must have been due (``retention_keeps_what_it_must``), must still
        verify (``verify_clean``) and hold digests (``compacted_holds_digests``); a kept run
        is never touched (``kept_runs_untouched``)."""
        with self._timed('compact'):
            if work:
                self._quiet_round()
            self._compact(policy, race, pick)

    def _compact(self, policy: str, race: str | None, pick: int) -> None:
        policies = retention.parse_policies(policy)
        before = self._retention_view()
        row = self.env.checker.execute("SELECT coalesce(max(id), 0) FROM onward.audit").fetchone()
        assert row is not None  # an aggregate's one row
        last_audit = row[0]
        with self._racing(retention, "candidates_txn", race, pick,
                          lambda page: [c.run_id for c in page.found
                                        if not c.held and not c.pinned]):
            retention.apply(self.ledger.engine, self.ledger.keys, policies)
        for run_id, kinds, seq in self.env.checker.execute(
                "SELECT a.run_id, a.details->'kinds', r.seq FROM onward.audit a "
                "JOIN onward.runs r ON r.id = a.run_id WHERE a.id > %s AND a.action = "
                "'retention' AND a.outcome = 'done'", (last_audit,)):
            self.env.stats["compacted_runs"] += 1
            for kind in kinds:
                self.book.compacted.setdefault(run_id, {})[kind] = seq
                why = self._due(before[run_id], policies, retention.Kind(kind))
                if why:
                    self.world.note("retention", f"run {run_id}: its {kind} were compacted "
                                    f"under policy {policy!r}, but {why}")
            self.book.verified.pop(run_id, None)
            self.book.opened.pop(run_id, None)
            self.book.tamper_checked.pop(run_id, None)  # still reported once compacted

    @precondition(conditions.has_refs)
    @rule(policy=st.sampled_from(EXPIRE_POLICIES), race=st.sampled_from(RACES),
          pick=st.integers(0, 15), work=st.booleans())
    def months_pass(self, policy: str, race: str | None, pick: int, work: bool) -> None:
        """A month and some days pass (``work``: after a round of the fleet's ordinary work);
        the reaper's retention pass makes the months ahead and drops each ended month of step
        attempts that ``policy`` lets go entirely; ``race``: a person holds or pins a
        finished run after the pass listed the partitions. A run that lost attempts must
        have been due (``retention_keeps_what_it_must``)."""
        with self._timed('months_pass'):
            if work:
                self._quiet_round()
            self._months_pass(policy, race, pick)

    def _months_pass(self, policy: str, race: str | None, pick: int) -> None:
        self.env.clock.advance(RETENTION_MONTH_DAYS * 86400)
        self.env.dirty.add("partitions")  # months made ahead, maybe this one dropped
        policies = retention.parse_policies(policy)
        partitions.ensure(self.ledger.engine)
        before = self._retention_view()
        with self._racing(partitions, "partitions_txn", race, pick,
                          lambda _parts: [r for r, v in self._retention_view().items()
                                          if v[0] in retention.TERMINAL and v[4]]):
            expired = partitions.expire(self.ledger.engine, self.ledger.keys, policies)
        if expired.dropped:
            self.env.stats["partitions_dropped"] += len(expired.dropped)
        after = self._retention_view()
        for run_id, view in before.items():
            if after[run_id][4] < view[4]:
                self.env.stats["attempts_expired"] += view[4] - after[run_id][4]
                why = self._due(view, policies, retention.Kind.ATTEMPTS, children=False)
                if why:
                    self.world.note("retention", f"run {run_id}: {view[4] - after[run_id][4]} "
                                    f"step attempts dropped with {expired.dropped} under "
                                    f"policy {policy!r}, but {why}")

    @contextlib.contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.env.stats[f"ms_rule_{name}"] += round((time.perf_counter() - started) * 1000)

    def _target(self) -> Ledger:
        return self.env.target_sealed if self.book.sealed else self.env.target

    @precondition(conditions.has_refs)
    @rule(run=runs)
    def export_import(self, run: UUID) -> None:
        """An operator pins a finished run in a corpus of its own, exports the corpus as a
        bundle and imports it into another ledger (``imports_verify``). A refusal is a
        finding, unless the run was imported before and has another head since (a failed run
        continued): a run's history is never replaced."""
        with self._timed('export_import'):
            self._export_import(run)

    def _export_import(self, run: UUID) -> None:
        self.exports += 1
        name = f"export-{self.exports}"
        corpora = Corpora(self.ledger)
        self.book.keeping = True
        try:
            corpora.add(name, Selection(run_ids=(run,)))
        except REFUSALS:
            return  # not finished, a replay or branch, or compacted
        out = io.BytesIO()
        try:
            corpora.export(name, out)
        except IntegrityViolation as exc:
            # a run this code cannot read is not exported, as an import would refuse it
            if run in self.book.tampered:
                return  # an edited run is not exported (tampering_detected)
            if run not in self.book.unreadable or UNREADABLE_CONTROL not in str(exc):
                self.world.note("export", f"run {run}: its export was refused: {exc}")
            return
        if run in self.book.unreadable:
            self.world.note("export", f"run {run}: exported though this code cannot read "
                                      "its wait control: an import here refuses it")
        bundle = read_bundle(out.getvalue(), self.ledger.keys)
        self.env.dirty.add("target")
        try:
            Corpora(self._target()).import_bundle(bundle)
        except REFUSALS as exc:
            if "with another history" not in str(exc):
                self.world.note("import", f"run {run}: its bundle was refused by the other "
                                f"ledger: {type(exc).__name__}: {exc}")
            return
        self.env.stats["imports"] += 1
        self.book.imported.append(run)

    @precondition(conditions.sealed_book)
    @rule(how=st.sampled_from(["rotate", "rotate", "resume", "erase"]))
    def keys(self, how: str) -> None:
        """An admin rotates the encryption keys (a new data key for the tenant, every sealed
        value re-encrypted under it; ``resume``: a rotation that stopped goes on), or erases
        the tenant's keys, while runs go on (a worker may be in a call, holding what it
        opened). ``opened_values_match`` and ``verify_clean`` look at every run again."""
        with self._timed('keys'):
            self._keys(how)

    def _keys(self, how: str) -> None:
        if how == "erase":
            self.ledger.erase_tenant_keys("model test: erase")
            self.book.erased = True
        else:
            self.ledger.rotate_keys(new_keys=how == "rotate")
        self.env.stats[f"keys_{how}"] += 1
        self.book.verified.clear()
        self.book.opened.clear()
        self.book.tamper_checked.clear()

    @precondition(conditions.unsettled)
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
        self.env.crashes.clear()
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
                                      self.worker_errors, plain=self.env.ledger,
                                      target=self._target()), DISABLED, self.env.stats)
        self.env.stats["check_ms"] += round((time.perf_counter() - started) * 1000)
        if found:
            lines = [f"{name}:\n    " + "\n    ".join(items) for name, items in found.items()]
            raise _violation(next(iter(found)))("invariants violated:\n" + "\n".join(lines))

    @invariant()
    def time_is_the_models(self) -> None:
        """The database's time is the model's (no real second passes in it): otherwise a
        slow example replays otherwise, and hypothesis fails it as flaky."""
        row = self.env.checker.execute("SELECT onward.now()").fetchone()
        assert row is not None
        now = row[0]
        if now != self.env.clock.now():
            raise _violation("time_is_the_models")(
                f"onward.now() is {now}, the model's time {self.env.clock.now()}")

    def teardown(self) -> None:
        for run_id, seq in self.book.edited.items():
            row = self.env.checker.execute("SELECT status, seq, parked_reason FROM onward.runs "
                                           "WHERE id = %s", (run_id,)).fetchone()
            if row is not None:
                self.env.stats[f"edited_ended_{row[2] or row[0]}"
                               f"{'_past' if row[1] > seq else ''}"] += 1
        for worker in self.workers:
            while worker.suspended:
                worker.resume("no_act_crash")
            worker.store.close()
        self.dispatcher.close()
        self.env.stats["provider_objects"] += len(self.world.provider.objects)
        self.env.stats["model_calls"] += sum(self.world.model.calls.values())


def _profile_name() -> str:
    return os.environ.get("ONWARD_MODEL_PROFILE", "model-ci")


def _seed() -> int | None:
    """The seed the run's examples are drawn from: ``ONWARD_MODEL_SEED``, else a new one in
    the CI profile (a failure in CI names it), else none (hypothesis's own, and its database
    of examples)."""
    if os.environ.get("ONWARD_MODEL_SEED"):
        return int(os.environ["ONWARD_MODEL_SEED"])
    return secrets.randbelow(2**32) if _profile_name() == "model-ci" else None


def _profile() -> hsettings:
    chosen = hsettings.get_profile(_profile_name())
    overrides: dict[str, Any] = {}
    if os.environ.get("ONWARD_MODEL_EXAMPLES"):
        overrides["max_examples"] = int(os.environ["ONWARD_MODEL_EXAMPLES"])
    if os.environ.get("ONWARD_MODEL_STEPS"):
        overrides["stateful_step_count"] = int(os.environ["ONWARD_MODEL_STEPS"])
    return hsettings(chosen, **overrides)


def test_protocol__invariants_hold_under_random_interleavings(
        settings: WorkerSettings, monkeypatch: pytest.MonkeyPatch,
        server_urls: dict[str, str], template_database: str, dropper: Any) -> None:
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
    clock.freeze(ledger.engine)  # only the model moves time (harness.Clock)
    clock.follow(ledger.engine)
    clock.install(monkeypatch)
    _reset_partitions(ledger.engine)  # the months around the clock's epoch
    crashes = Crashes()
    config = ExecutorConfig(keys=ledger.keys, max_state_bytes=settings.max_state_bytes,
                            retry_base_s=1.0, retry_max_s=10.0)
    checker = clock.connect_raw(ledger.url)  # the test's own reads, on the ledger's clock
    stats: Counter[str] = Counter()
    jitter = random.Random(0)
    # other threads (psycopg_pool's) draw from the global generator at times of their own
    monkeypatch.setattr(tasks.executor, "random", jitter)
    # the same ledger with encryption keys (each example chooses), and a second ledger that
    # corpus bundles are imported into (with and without the keys)
    keyed = settings.model_copy(update={"encryption_keys": SecretStr(f"m1={MASTER_KEY}")})
    sealed = Ledger(ledger.engine, keyed)
    sealed_config = ExecutorConfig(keys=sealed.keys, max_state_bytes=settings.max_state_bytes,
                                   retry_base_s=1.0, retry_max_s=10.0)
    target_name, target_url = create_database(server_urls["database"], "onward_model",
                                              template=template_database)
    target = Ledger.from_env(settings.model_copy(update={"database_url": target_url}))
    target_sealed = Ledger(target.engine, keyed.model_copy(update={"database_url": target_url}))
    for keyring, engine in ((sealed, ledger.engine), (target_sealed, target.engine)):
        assert keyring.keys.crypt is not None
        keyring.keys.crypt.use_engine(engine)
    ENV = Environment(ledger, clock, crashes, config, checker, stats, jitter, sealed,
                      sealed_config, target, target_sealed)
    started = time.monotonic()
    chosen_seed = _seed()
    replay = f"seed {chosen_seed} (ONWARD_MODEL_SEED={chosen_seed} replays this run)" \
        if chosen_seed is not None else "hypothesis's seed"

    def machine() -> ProtocolMachine:  # a factory of its own: hypothesis.seed marks it
        return ProtocolMachine()

    if chosen_seed is not None:
        machine = seed(chosen_seed)(machine)
    try:
        with crashes.installed():
            run_state_machine_as_test(machine, settings=_profile())
    except BaseException as exc:
        exc.add_note(f"model test: {replay}")
        raise
    finally:
        ENV = None
        checker.close()
        ledger.engine.dispose()
        target.engine.dispose()
        dropper.drop(target_name)
        print(f"\nmodel test: {dict(sorted(stats.items()))} in "
              f"{time.monotonic() - started:.1f}s, {replay}")
