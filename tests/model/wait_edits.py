"""The model test's rules for a waiting run made runnable outside onward, and for `continue`
of a run whose head is a wait (docs/design.md section 13 invariant 5; docs/security.md).

``edit_wait``: someone with write access to the database, not the MAC key, makes a run at a
wait runnable: a signal's or an approval's run set ``running`` at one of the steps its wait
control names (``waiting_on`` cleared, an outbox row written due now, maybe published to the
broker at once), or a timer's outbox row made due now. ``continue_at_wait``: an operator
continues a run whose head checkpoint is a wait (parked, failed, or runnable unleased).

What the model expects, checked by the invariants of tests/model/invariants.py:

* ``steps_follow_their_events``: whenever a step body starts on an original run whose head
  checkpoint is a wait, what ended the wait happened, as the model saw it: the timer's time
  passed; the signal was consumed at that seq (or, at ``on_timeout``, the timeout passed);
  the model approved (``then``) or rejected the approval, or its time passed;
* ``edited_waits_park``: an edited run stopped at its wait is parked ``integrity`` (or for
  what parks a run before its wait is looked at: crashes, the code deployed);
* ``continue_rewaits``: a continued run whose wait has not ended is back on that wait.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, multiple, precondition, rule

from ledger.exceptions import MalformedControl
from ledger.wait_control import (
    AnyControl,
    ApprovalControl,
    SignalControl,
    TimerControl,
    parse_control,
)
from tests.model import conditions
from tests.model.machine import MachineParts

__all__ = ["WaitEdits", "event_missing"]

WAIT_OPS = ["signal", "approve", "approve_strict", "sleep"]
# a wait head no worker holds, on an original run, whose control this code reads
_AT_A_WAIT = """
    SELECT r.id, r.seq, r.status, r.step, c.control, onward.now()
      FROM onward.runs r
      JOIN onward.checkpoints c ON c.run_id = r.id AND c.seq = r.seq AND c.outcome = 'wait'
     WHERE r.mode IS NULL AND r.lease_owner IS NULL AND r.cancel_requested IS NULL
       AND {where}
     ORDER BY r.id"""
_EDITABLE = "(r.status = 'waiting' OR (r.status = 'running' AND r.waiting_on LIKE 'timer:%'))"
_CONTINUABLE = "r.status IN ('needs_review', 'failed', 'running')"


def _when(iso: str | None) -> datetime | None:
    return datetime.fromisoformat(iso) if iso else None


def _consumed(checker: Any, run_id: UUID, name: str, seq: int) -> bool:
    return checker.execute(
        "SELECT 1 FROM onward.signals WHERE run_id = %s AND name = %s AND consumed_seq = %s",
        (run_id, name, seq)).fetchone() is not None


def event_missing(checker: Any, decisions: dict[UUID, str], run_id: UUID, seq: int,
                  step: str) -> str | None:
    """Why step ``step`` may not start now on ``run_id`` at ``seq`` (None: it may, or the
    run's checkpoint ``seq`` is no wait), as the model saw the wait end."""
    row = checker.execute(
        "SELECT c.control, onward.now(), a.expires_at FROM onward.checkpoints c "
        "JOIN onward.runs r ON r.id = c.run_id "
        "LEFT JOIN onward.approvals a ON a.id::text = c.control->>'approval_id' "
        "WHERE c.run_id = %s AND c.seq = %s AND c.outcome = 'wait' AND r.mode IS NULL",
        (run_id, seq)).fetchone()
    if row is None:
        return None
    try:
        control, now, expires = parse_control(row[0]), row[1], row[2]
    except MalformedControl:
        return None  # a newer onward's control: unreadable_control_parks sees to it
    if isinstance(control, TimerControl):
        until = _when(control.until)
        return None if until is not None and now >= until else f"its timer runs at {until}"
    if isinstance(control, SignalControl):
        timed_out = control.timeout_at is not None and now >= _when(control.timeout_at)
        if step == control.then and (_consumed(checker, run_id, control.name, seq) or (
                timed_out and control.on_timeout == control.then)):
            return None
        if step == control.on_timeout and timed_out:
            return None
        return f"no signal {control.name!r} was consumed at seq {seq}, timeout {control.timeout_at}"
    if isinstance(control, ApprovalControl):
        decided = decisions.get(UUID(control.approval_id))
        if step == control.then and decided == "approved":
            return None
        if step == control.on_reject and decided == "rejected":
            return None
        if step == control.on_expire and decided is None and expires is not None \
                and now >= expires:
            return None
        return f"approval {control.approval_id} was {decided or 'not decided'} (expires {expires})"
    return None


class WaitEdits(MachineParts):
    """Rules mixed into tests/model/test_protocol.py's ProtocolMachine."""

    # -- the model's check, as each step body starts -----------------------------------------
    def _event_check(self, ctx: Any) -> None:
        missing = event_missing(self.env.checker, self.book.decisions, ctx.run_id, ctx.seq,
                                ctx.step)
        if missing is not None:
            self.world.note("no_event", f"run {ctx.run_id}: step {ctx.step!r} started at seq "
                            f"{ctx.seq}, whose wait has not ended: {missing}")

    def _waits(self, where: str) -> list[tuple[Any, ...]]:
        found = self.env.checker.execute(_AT_A_WAIT.format(where=where)).fetchall()
        return sorted((r for r in found if r[0] not in self.book.unreadable),
                      key=lambda r: self._rank(r[0]))  # type: ignore[attr-defined]

    # -- rules ---------------------------------------------------------------------------------
    @precondition(conditions.idle_worker_and_refs)
    @rule(target=Bundle("runs"), pick=st.integers(0, 15), other=st.booleans(),
          direct=st.booleans(), prepare=st.sampled_from([None, *WAIT_OPS]))
    def edit_wait(self, pick: int, other: bool, direct: bool, prepare: str | None) -> Any:
        """A run at a wait made runnable in the database (``prepare``: a run started first,
        that waits on that op, and delivered to its wait): a signal's or an approval's run set
        running at its wait's ``then`` (``other``: at its ``on_timeout``/``on_reject``), an
        outbox row written due now (``direct``: published to the broker too); a timer's
        outbox row made due now. It must park ``integrity`` when claimed before its event."""
        with self._timed("edit_wait"):  # type: ignore[attr-defined]
            started = self._to_a_wait(prepare) if prepare else None
            waits = self._waits(_EDITABLE)
            if started is not None:
                waits = [r for r in waits if r[0] == started] or waits
            if waits:
                self._edit(waits[pick % len(waits)], other, direct)
            return multiple(started) if started is not None else multiple()

    def _to_a_wait(self, op: str) -> UUID | None:
        """A run whose plan waits on ``op`` then sends mail, delivered to its wait."""
        run_id = self.start([op, "mail"], "none")  # type: ignore[attr-defined]
        if not isinstance(run_id, UUID):
            return None
        self.dispatcher.sweep(crash_before_mark=False)
        for _ in range(3):
            mine = [i for i, m in enumerate(self.broker.messages) if m[0] == run_id]
            idle = [w for w in self.workers if w.idle]
            if not mine or not idle:
                break
            self.world.provider.script.clear()
            self.world.model.script.clear()
            self.env.crashes.clear()
            self._record(idle[0], idle[0].deliver(  # type: ignore[attr-defined]
                self.broker.messages.pop(mine[0]), 0))
            self.dispatcher.sweep(crash_before_mark=False)
        return run_id

    def _edit(self, row: tuple[Any, ...], other: bool, direct: bool) -> None:
        run_id, seq, status, _step, raw, _now = row
        control = parse_control(raw)
        assert control is not None
        with self.ledger.engine.begin() as conn:
            conn.execute(sa.text("SELECT 1 FROM onward.runs WHERE id = :r FOR UPDATE"),
                         {"r": run_id})
            if status == "waiting":
                extra = sorted(control.continuations - {control.then})
                step = extra[0] if other and extra else control.then
                conn.execute(sa.text(
                    "UPDATE onward.runs SET status = 'running', waiting_on = NULL, "
                    "wait_until = NULL, step = :step WHERE id = :r"), {"r": run_id, "step": step})
                where = "then" if step == control.then else "other"
                self.env.stats[f"edited_{control.kind}_{where}"] += 1
            else:
                self.env.stats["edited_timer"] += 1
            conn.execute(sa.text(
                "INSERT INTO onward.outbox (run_id, seq) VALUES (:r, :s) ON CONFLICT (run_id, "
                "seq) DO UPDATE SET due_at = onward.now(), published_at = NULL"),
                {"r": run_id, "s": seq})
        if direct:
            self.broker.publish(run_id, seq)
        self.book.edited[run_id] = seq

    @precondition(conditions.has_refs)
    @rule(pick=st.integers(0, 15))
    def continue_at_wait(self, pick: int) -> None:
        """An operator continues a run whose head is a wait (parked, failed, or runnable with
        nobody holding it): a wait that has not ended is waited on again
        (``continue_rewaits``), a timer's step is due at its time; the step past the wait
        never runs without its event (``steps_follow_their_events``)."""
        with self._timed("continue_at_wait"):  # type: ignore[attr-defined]
            waits = self._waits(_CONTINUABLE)
            if not waits:
                return
            run_id, seq, _status, step, raw, now = waits[pick % len(waits)]
            control = parse_control(raw)
            assert control is not None
            expected = self._expected_after_continue(run_id, seq, step, control, now)
            if self._continue(run_id):  # type: ignore[attr-defined]
                self.env.stats["continued_at_wait"] += 1
                self._check_continued(run_id, seq, control, expected)

    def _expected_after_continue(self, run_id: UUID, seq: int, step: str,
                                 control: AnyControl, now: datetime) -> str | None:
        """What a continue must leave the run on (None: the wait ended, the step runs now):
        ``timer``, ``signal`` (or a kept signal taken at once), ``approval``."""
        if isinstance(control, TimerControl):
            return "timer" if _when(control.until) > now else None
        if isinstance(control, SignalControl):
            timed_out = control.timeout_at is not None and now >= _when(control.timeout_at)
            if timed_out and step == control.on_timeout:
                return None
            if step == control.then and _consumed(self.env.checker, run_id, control.name, seq):
                return None
            return "signal"
        status = self.env.checker.execute(
            "SELECT status FROM onward.approvals WHERE id = %s",
            (UUID(control.approval_id),)).fetchone()
        return "approval" if status is not None and status[0] == "pending" else None

    def _check_continued(self, run_id: UUID, seq: int, control: AnyControl,
                         expected: str | None) -> None:
        row = self.env.checker.execute(
            "SELECT r.status, r.step, r.waiting_on, r.seq, (SELECT o.due_at FROM onward.outbox o "
            "WHERE o.run_id = r.id AND o.seq = r.seq) FROM onward.runs r WHERE r.id = %s",
            (run_id,)).fetchone()
        assert row is not None
        status, step, waiting_on, at, due = row
        if expected is None or at != seq:
            return
        if isinstance(control, TimerControl):
            ok = (status, waiting_on, due) == ("running", f"timer:{control.until}",
                                               _when(control.until))
        elif isinstance(control, SignalControl):
            ok = (status, step, waiting_on) == ("waiting", control.then,
                                                f"signal:{control.name}") or (
                status == "running" and step == control.then
                and _consumed(self.env.checker, run_id, control.name, seq))
        else:
            ok = (status, step, waiting_on) == ("waiting", control.then,
                                                f"approval:{control.approval_id}")
        if not ok:
            self.world.note("continue_wait", f"run {run_id} continued at its {control.kind} "
                            f"wait (seq {seq}), which has not ended, is {status} at step "
                            f"{step!r} (waiting_on {waiting_on}, outbox due {due}): not back "
                            f"on its wait")
