"""The model test's rules for retries that take another path, and for operator commands
and waits interleaved with a worker stopped, or killed, at a named fault point
(docs/design.md section 13; docs/effects.md, "When a run ends: resolve first").

``retry_another_path``: a run whose step makes an effect on its first attempt only
(``fickle``: a tool with a lookup; ``fickle_blind``: without one) is killed where the
effect's outcome is left unknown (after the provider acted, or after the intent and before
the call, or with the response lost or the worker killed in a hung call), and its lease
lapses; the retry (here at once, or later by the other rules) does not make that call. It
must resolve the effect before it commits (``no_effect_left_behind_a_commit``) or park
``effect_outcome_unknown``; nothing is sent twice (``one_object_per_effect``).

``operator_at_a_stall``: a worker stops at a named fault point (a pause, a SIGSTOP) in a
step of any run, or of a run that enters (``enter``) or leaves (``resume``) a wait; then a
person acts on that run (cancel, continue, resolve its effects as the provider shows them,
approve or reject its approval, signal it) or time passes until its lease, approval or
signal timeout lapses and the reaper sweeps; then the worker goes on, is killed there, or is
left stopped for later rules. ``resolve_effect``: a person resolves an effect whose outcome
is unknown as the provider shows it. Every invariant holds after each.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any
from uuid import UUID

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, multiple, precondition, rule

from ledger.api import REFUSALS
from ledger.operations import Finding, resolve_plan
from ledger.vocabulary import ApprovalStatus
from tasks import faults
from tests.model import conditions
from tests.model.harness import LEASE_TTL_S, STALL_AFTER_S
from tests.model.machine import MachineParts

__all__ = ["Interleavings"]

FICKLE = ["fickle", "fickle_blind"]
# where the first attempt leaves the effect: a fault point, the response lost, or a hung
# call in which the worker is killed (acted or not)
LEFT_BY = ["after_provider_response", "after_effect_pending", "after_effect_recorded",
           "lose", "hang_act_crash", "hang_no_act_crash"]
STALL_POINTS = sorted(faults.POINTS - {"dispatcher_after_publish_before_mark"})
COMMANDS = ["cancel", "continue", "resolve", "approve", "reject", "signal", "lapse", "none"]
THEN = ["go", "crash", "leave"]
PREPARE = [None, "approve", "approve_strict", "signal", "sleep"]


class Interleavings(MachineParts):
    """Rules mixed into tests/model/test_protocol.py's ProtocolMachine."""

    # -- a retry that takes another path ----------------------------------------------------
    @precondition(conditions.idle_worker)
    @rule(target=Bundle("runs"), op=st.sampled_from(FICKLE), left_by=st.sampled_from(LEFT_BY),
          then=st.sampled_from(["mail", "llm", "sleep"]), retry_now=st.booleans())
    def retry_another_path(self, op: str, left_by: str, then: str, retry_now: bool) -> Any:
        """A run's first attempt makes an effect and leaves its outcome unknown
        (``left_by``); the lease lapses and the reaper gives the step back; the retry
        (``retry_now``: delivered at once) takes another path without that call."""
        with self._timed("retry_another_path"):  # type: ignore[attr-defined]
            run_id = self.start([op, then], "none")  # type: ignore[attr-defined]
            if not isinstance(run_id, UUID):
                return multiple()
            self.env.stats[f"fickle_{op}_{left_by}"] += 1
            self.dispatcher.sweep(crash_before_mark=False)
            worker = self._idle()
            message = self._message_of(run_id)
            if worker is None or message is None:
                return run_id
            self._first_attempt(worker, message, left_by)
            self._lapse(run_id)
            if retry_now:
                worker, message = self._idle(), self._message_of(run_id)
                if worker is not None and message is not None:
                    self.env.crashes.clear()
                    self._record(worker, worker.deliver(message, 0))  # type: ignore[attr-defined]
            return run_id

    def _first_attempt(self, worker: Any, message: tuple[UUID, int], left_by: str) -> None:
        self.world.provider.script.clear()
        self.world.model.script.clear()
        self.env.crashes.clear()
        if left_by == "lose":
            self.world.provider.script.append("lose")
        elif left_by.startswith("hang"):
            self.world.provider.script.append("hang")
        else:
            self.env.crashes.point = left_by
        delivery = worker.deliver(message, 0)
        self._record(worker, delivery)  # type: ignore[attr-defined]
        if delivery.state == "suspended" and left_by.startswith("hang"):
            self._record(worker, worker.resume(left_by.removeprefix("hang_")))  # type: ignore[attr-defined]

    def _idle(self) -> Any:
        return next((w for w in self.workers if w.idle), None)

    def _message_of(self, run_id: UUID) -> tuple[UUID, int] | None:
        mine = [i for i, m in enumerate(self.broker.messages) if m[0] == run_id]
        if not mine:
            self.dispatcher.sweep(crash_before_mark=False)
            mine = [i for i, m in enumerate(self.broker.messages) if m[0] == run_id]
        return self.broker.messages.pop(mine[0]) if mine else None

    def _lapse(self, run_id: UUID, extra_s: float = 0.0) -> None:
        """Time passes until the run's lease (and ``extra_s`` more) has lapsed; the reaper
        sweeps (a stalled step given back, an approval expired, a signal timed out)."""
        left = self.env.checker.execute(
            "SELECT extract(epoch FROM lease_expires_at - onward.now()) FROM onward.runs "
            "WHERE id = %s", (run_id,)).fetchone()
        wait = max(float(left[0] or 0) if left else 0.0, LEASE_TTL_S, extra_s)
        self.env.clock.advance(math.ceil(wait) + 1)  # whole seconds: examples replay
        self.reaper.sweep(stall_after_s=STALL_AFTER_S)

    # -- operator commands and waits around a worker stopped at a fault point ---------------
    @precondition(conditions.idle_worker_and_refs)
    @rule(target=Bundle("runs"), point=st.sampled_from(STALL_POINTS),
          command=st.sampled_from(COMMANDS),
          then=st.sampled_from(THEN), prepare=st.sampled_from(PREPARE),
          phase=st.sampled_from(["enter", "resume"]), pick=st.integers(0, 63))
    def operator_at_a_stall(self, point: str, command: str, then: str, prepare: str | None,
                            phase: str, pick: int) -> Any:
        """A worker stops at fault point ``point`` in a step (of any run; or, ``prepare``, of
        a run waiting on that op, in the step that enters its wait or, ``resume``, in the
        step its event resumes); a person then acts on that run (``command``), and the
        worker goes on, is killed there, or stays stopped (``then``)."""
        with self._timed("operator_at_a_stall"):  # type: ignore[attr-defined]
            started = self._prepare(prepare, phase) if prepare else None
            worker = self._idle()
            if started is not None:
                message = self._message_of(started)
            else:
                if not self.broker.messages:
                    self.dispatcher.sweep(crash_before_mark=False)
                message = self.broker.take(pick, keep=False) if self.broker.messages else None
            if worker is None or message is None:
                return multiple(started) if started is not None else multiple()
            self.world.provider.script.clear()
            self.world.model.script.clear()
            self.env.crashes.clear()
            self.env.crashes.stall = point
            delivery = worker.deliver(message, 0)
            self._record(worker, delivery)  # type: ignore[attr-defined]
            self.env.crashes.clear()
            stopped = delivery.state == "suspended"
            self.env.stats[f"stall_{'stopped' if stopped else 'passed'}"] += 1
            self._command(message[0], command)
            if stopped and not worker.idle and then != "leave":
                self.env.stats[f"stall_{command}_{then}"] += 1
                action = "act_answer" if then == "go" else "no_act_crash"
                self._record(worker, worker.resume(action))  # type: ignore[attr-defined]
            return multiple(started) if started is not None else multiple()

    def _prepare(self, op: str, phase: str) -> UUID | None:
        """A run waiting on ``op``: new (its first step enters the wait), or taken to its
        wait and its event given (the next step resumes from it)."""
        if phase == "enter":
            run_id = self.start([op, "mail"], "none")  # type: ignore[attr-defined]
            return run_id if isinstance(run_id, UUID) else None
        run_id = self._to_a_wait(op)  # type: ignore[attr-defined]
        if run_id is not None:
            self._command(run_id, {"approve": "approve", "approve_strict": "approve",
                                   "signal": "signal", "sleep": "lapse"}[op])
        return run_id  # type: ignore[no-any-return]

    def _command(self, run_id: UUID, command: str) -> None:
        """A person acts on the run (refusals are answers too), or time passes."""
        if command == "none":
            return
        if command == "lapse":  # past its lease, an approval's expiry, a signal's timeout
            self._lapse(run_id, extra_s=121)
            return
        with contextlib.suppress(*REFUSALS):
            if command == "cancel":
                self.ledger.cancel(run_id, "model test: cancel at a stall")
            elif command == "continue":
                self._continue(run_id)  # type: ignore[attr-defined]
            elif command == "resolve":
                for effect in self.ledger.effects(run_id):
                    self._resolve(effect)
            elif command == "signal":
                self.ledger.signal(run_id, "go", {"n": 7, "note": self.book.notes[run_id]})
            else:
                self._decide_run(run_id, command == "approve")
            self.env.stats[f"command_{command}"] += 1

    def _decide_run(self, run_id: UUID, approve: bool) -> None:
        for approval in self.ledger.approvals(status=ApprovalStatus.PENDING, run_id=run_id):
            decide = self.ledger.approve if approve else self.ledger.reject
            decide(approval.id, artifact_hash=approval.artifact_hash, comment="model test")
            self.book.decisions[approval.id] = "approved" if approve else "rejected"

    # -- effects resolve --------------------------------------------------------------------
    @rule(pick=st.integers(0, 15))
    def resolve_effect(self, pick: int) -> None:
        """An admin resolves an effect whose outcome onward cannot learn, as the provider
        shows it (completed with the object it holds for the effect's key, or not sent);
        refused while a worker holds the step."""
        effects = sorted((e for e in self.ledger.find_effects(limit=500)
                          if e.status.value in ("pending", "accepted")),
                         key=lambda e: (self._rank(e.run_id), e.seq, e.command_id))  # type: ignore[attr-defined]
        if effects:
            with contextlib.suppress(*REFUSALS):
                self._resolve(effects[pick % len(effects)])

    def _resolve(self, effect: Any) -> None:
        if effect.status.value not in ("pending", "accepted"):
            return
        keys = {a.idempotency_key for a in self.ledger.effect_attempts(effect)}
        collection = effect.effect_type.removeprefix("model.")
        found = [o for o in self.world.provider.objects
                 if o.collection == collection and o.key in keys]
        if found:
            finding, ref = Finding.COMPLETED, found[0].id
            result: dict[str, Any] | None = {"id": ref, "intent": found[0].body.get("intent")}
        else:
            finding, ref, result = Finding.NOT_SENT, None, None
        plan = resolve_plan(effect, finding, ref, result)
        self.ledger.resolve_effect(effect.effect_type, effect.effect_id,
                                   "model test: looked at the provider", plan,
                                   finding=finding, provider_ref=ref, result=result)
        self.env.stats[f"resolved_{finding.value}"] += 1
