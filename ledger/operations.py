"""Operator commands on one run (docs/design.md section 8): continue, cancel, approve/reject, and
the ledger half of repeating an external effect. Replays and branches are in ``forks.py``.

Each ``*_txn`` function checks the actor's role, takes the run's row lock, lets the
database guard the state transition (``UPDATE … WHERE status = …``), and writes its audit
row, all inside the caller's transaction. A refusal raises before anything is written;
``Ledger`` then records the refusal in a transaction of its own.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from ledger import signed, sql, waits
from ledger.attempt_history import check_attempts_txn
from ledger.audit import Actor, AuditRecord, record_txn
from ledger.checkpoints import CheckpointKeys
from ledger.effects import Effect, seal_effect_error, seal_effect_result
from ledger.exceptions import (
    InvalidInput,
    MalformedControl,
    OperationRefused,
    UnknownEffect,
    UnknownRun,
)
from ledger.schema import (
    approvals,
    checkpoints,
    effect_attempts,
    effects,
    outbox,
    refused_answers,
    runs,
)
from ledger.vocabulary import (
    ApprovalStatus,
    AuditAction,
    AuditOutcome,
    EffectAttemptKind,
    EffectAttemptOutcome,
    EffectStatus,
    FailReason,
    LaunchMode,
    OutcomeKind,
    ParkReason,
    RunStatus,
)
from ledger.wait_control import ApprovalControl, SignalControl, TimerControl, parse_control

__all__ = [
    "REPLAY_MODES",
    "Cancelled",
    "Continued",
    "Finding",
    "Landing",
    "RepeatStarted",
    "begin_repeat_txn",
    "cancel_txn",
    "continue_run_txn",
    "decide_approval_txn",
    "finish_repeat_txn",
    "get_effect_txn",
    "lock_run_txn",
    "queue_step_txn",
    "repeat_key",
    "require_reason",
    "resolve_effect_txn",
    "resolve_plan",
]


REPLAY_MODES = (LaunchMode.EVIDENCE, LaunchMode.SIMULATION, LaunchMode.LIVE)

# Failures that are decisions, not accidents: continuing would only repeat them.
_DECIDED_FAILURES: dict[str, str] = {
    FailReason.BUDGET_EXHAUSTED:
        "budgets are never refilled by a restore; replay it with budgets reset",
    FailReason.DEADLINE_EXCEEDED: "its deadline has passed; replay it with budgets reset",
    FailReason.APPROVAL_REJECTED: "a person rejected it; branch it if the artifact should change",
    FailReason.APPROVAL_EXPIRED: "its approval expired; replay or branch it to ask again",
    FailReason.APPROVAL_INVALID: "the approval it needed is not approved",
    FailReason.SIGNAL_TIMEOUT: "the signal it waited for never came; replay it to wait again",
    FailReason.IRREVERSIBLE_BLOCKED: "start a new replay or branch with --allow-irreversible",
    FailReason.NO_SIMULATION:
        "a tool has no simulate implementation; replay it live or from evidence",
}
# Failures with a reason that continue resumes: the cause was outside the run (a model or
# tool answer the ledger cannot record); the resumed step asks again, paid again.
_CONTINUABLE_FAILURES = frozenset({FailReason.INVALID_ANSWER})


def require_reason(reason: str | None, action: AuditAction) -> str:
    if reason is None or not reason.strip():
        raise InvalidInput(f"{action.value} needs a reason (--reason): it is kept in the audit "
                           "log with your name")
    return reason.strip()


def lock_run_txn(conn: Connection, run_id: UUID, actor: Actor) -> RowMapping:
    """The run's row, locked; refuses runs that do not exist or belong to another tenant."""
    row = conn.execute(sa.select(runs).where(runs.c.id == run_id).with_for_update()).mappings()
    found = row.first()
    if found is None:
        raise UnknownRun(f"no run {run_id}")
    if found["tenant_id"] != actor.tenant_id:
        raise OperationRefused(f"run {run_id} belongs to tenant {found['tenant_id']!r}; "
                               f"{actor.name} operates tenant {actor.tenant_id!r}")
    return found


def _now(conn: Connection) -> datetime:
    return conn.execute(sa.select(sa.func.onward.now())).scalar_one()


def _leased(run: RowMapping, now: datetime) -> bool:
    expires = run["lease_expires_at"]
    return expires is not None and expires > now


_QUEUE_STEP_AT = sql.statement("queue_step_at")


def queue_step_txn(conn: Connection, run_id: UUID, seq: int, due_at: Any = None) -> None:
    """(Re)write the outbox row that sends ``(run_id, seq)`` to the fleet."""
    conn.exec_driver_sql(_QUEUE_STEP_AT, {"run_id": run_id, "seq": seq, "due_at": due_at})


# -- continue -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Continued:
    run_id: UUID
    seq: int
    step: str | None
    previous_status: RunStatus
    # the run's head is a wait that has not ended: it waits again on this (a signal or an
    # approval), or, for a timer, its step is queued due at ``due_at``
    waiting_on: str | None = None
    due_at: datetime | None = None


def continue_run_txn(conn: Connection, keys: CheckpointKeys, actor: Actor, run_id: UUID,
                     reason: str | None) -> Continued:
    """Resume the original run at its current seq: parked (``needs_review``), failed by an
    error, or runnable with nobody holding it. Everything else is refused with the command
    that fits."""
    actor.require(AuditAction.CONTINUE)
    reason = require_reason(reason, AuditAction.CONTINUE)
    run = lock_run_txn(conn, run_id, actor)
    status = RunStatus(run["status"])
    _check_continuable(conn, run, status)
    rewait = _wait_left(conn, run)
    _move_continued(conn, run_id, run, status, rewait)
    _lift_what_stopped_it(conn, run_id, run, status)
    _requeue_or_rewait(conn, run_id, run, rewait)
    step = rewait.step if rewait else run["step"]
    record_txn(conn, keys, actor, AuditRecord(
        AuditAction.CONTINUE, AuditOutcome.DONE, reason, run_id=run_id,
        before_seq=run["seq"], after_seq=run["seq"],
        details={"previous_status": status.value, "step": step,
                 "parked_reason": run["parked_reason"], "last_error": run["last_error"],
                 **({"waits_on": rewait.waiting_on} if rewait and rewait.waiting_on else {})}))
    return Continued(run_id, run["seq"], step, status,
                     waiting_on=rewait.waiting_on if rewait else None,
                     due_at=rewait.due_at if rewait else None)


def _move_continued(conn: Connection, run_id: UUID, run: RowMapping, status: RunStatus,
                    rewait: _Rewait | None) -> None:
    """The run's row, runnable again (or waiting again), its lease and error cleared."""
    # Only a run continue unblocks gets its step's attempts back: a parked or failed one,
    # or a running one whose attempts are spent. A runnable run keeps its counts.
    unblocks = status is not RunStatus.RUNNING or run["attempt"] >= run["max_attempts"]
    counts = {"attempt": 0, "handbacks": 0} if unblocks else {}
    moved = conn.execute(
        runs.update()
        .where(runs.c.id == run_id, runs.c.seq == run["seq"], runs.c.status == status.value)
        .values(status=rewait.status.value if rewait else RunStatus.RUNNING.value,
                lease_owner=None, lease_expires_at=None,
                parked_reason=None, last_error=None, finished_at=None,
                updated_at=sa.func.onward.now(), **counts, **(rewait.values() if rewait else {}))
        .returning(runs.c.id)
    ).first()
    if moved is None:  # pragma: no cover - the row lock makes this unreachable
        raise OperationRefused(f"run {run_id} changed while it was being continued")


def _lift_what_stopped_it(conn: Connection, run_id: UUID, run: RowMapping,
                          status: RunStatus) -> None:
    """What held the step back, by why it parked or failed, no longer holds it."""
    if run["parked_reason"] == ParkReason.EFFECT_STALLED:
        # a person continues a job polled past its tool's status_timeout_s: the step asks
        # the provider again, with a fresh polling window of that length
        conn.execute(effects.update()
                     .where(effects.c.run_id == run_id,
                            effects.c.status == EffectStatus.ACCEPTED.value)
                     .values(polling_since=sa.func.onward.now(),
                             updated_at=sa.func.onward.now()))
    if status is RunStatus.FAILED and \
            (run["last_error"] or {}).get("reason") == FailReason.INVALID_ANSWER:
        # a person decided the step asks again: the refusals of its unusable answers, which
        # stop any retry from calling again, no longer stand
        conn.execute(refused_answers.update()
                     .where(refused_answers.c.run_id == run_id,
                            refused_answers.c.seq == run["seq"],
                            refused_answers.c.cleared_at.is_(None))
                     .values(cleared_at=sa.func.onward.now()))


def _requeue_or_rewait(conn: Connection, run_id: UUID, run: RowMapping,
                       rewait: _Rewait | None) -> None:
    """Queue the step (due at a timer's time), or leave the run waiting on its wait."""
    if rewait is None or rewait.status is RunStatus.RUNNING:
        queue_step_txn(conn, run_id, run["seq"], rewait.due_at if rewait else None)
    else:  # waiting again; delete a message queued for the step, take a signal kept meanwhile
        conn.execute(outbox.delete().where(outbox.c.run_id == run_id,
                                           outbox.c.seq == run["seq"]))
        conn.exec_driver_sql(waits.WAKE_ON_SIGNAL, {"run_id": run_id, "seq": run["seq"]})


@dataclass(frozen=True)
class _Rewait:
    """How a continued run goes on when its head checkpoint's wait has not ended: back to
    waiting for its signal or approval, or runnable with its step due at the timer's time
    (or, after a decided approval, at the step the decision names, now)."""
    status: RunStatus
    step: str
    waiting_on: str | None
    wait_until: datetime | None = None
    due_at: datetime | None = None

    def values(self) -> dict[str, Any]:
        return {"step": self.step, "waiting_on": self.waiting_on, "wait_until": self.wait_until}


_SIGNAL_AT = sql.statement("signal_payload")


def _wait_left(conn: Connection, run: RowMapping) -> _Rewait | None:
    """What the wait recorded at the run's head checkpoint still waits for, as its MAC'd
    control signs it (a worker's claim checks the same: tasks/policy.py), or None when
    there is no wait there or it ended (the timer's time passed, a signal was consumed at
    that seq or the wait timed out, the approval was decided): the step runs now. A step
    queued now before its wait ended would be parked ``integrity`` by its claim. Refuses a
    run whose approval was decided, or expired, with no step to go on to. A run with a
    cancel request is sent to a worker now, which ends it without running its step."""
    if run["cancel_requested"] is not None:
        return None  # the worker it is sent to now ends it, running no step
    raw = conn.execute(sa.select(checkpoints.c.control).where(
        checkpoints.c.run_id == run["id"], checkpoints.c.seq == run["seq"])).scalar()
    try:
        control = parse_control(raw, f"checkpoint {run['seq']} of run {run['id']}")
    except MalformedControl:
        return None  # a worker parks it invalid_control again: nothing is guessed here
    now = _now(conn)
    if isinstance(control, TimerControl):
        until = datetime.fromisoformat(control.until)
        return (_Rewait(RunStatus.RUNNING, control.then, f"timer:{control.until}", due_at=until)
                if until > now else None)
    if isinstance(control, SignalControl):
        return _signal_left(conn, run, control, now)
    if isinstance(control, ApprovalControl):
        return _approval_left(conn, run, control)
    return None


def _signal_left(conn: Connection, run: RowMapping, control: SignalControl,
                 now: datetime) -> _Rewait | None:
    timed_out = control.timeout_at is not None and \
        datetime.fromisoformat(control.timeout_at) <= now
    if timed_out and run["step"] == control.on_timeout:
        return None
    if run["step"] == control.then and conn.exec_driver_sql(_SIGNAL_AT, {
            "run_id": run["id"], "name": control.name, "seq": run["seq"]}).first():
        return None
    # waiting again; a timeout already past is the reaper's: on_timeout, or failed
    return _Rewait(RunStatus.WAITING, control.then, f"signal:{control.name}",
                   wait_until=(datetime.fromisoformat(control.timeout_at)
                               if control.timeout_at else None))


def _approval_left(conn: Connection, run: RowMapping,
                   control: ApprovalControl) -> _Rewait | None:
    status = conn.execute(sa.select(approvals.c.status).where(
        approvals.c.id == UUID(control.approval_id), approvals.c.run_id == run["id"],
        approvals.c.seq == run["seq"])).scalar()
    if status is None or status == ApprovalStatus.PENDING.value:
        # pending (an expiry already past is the reaper's); none: the worker parks it
        return (None if status is None else
                _Rewait(RunStatus.WAITING, control.then, f"approval:{control.approval_id}"))
    step = {ApprovalStatus.APPROVED.value: control.then,
            ApprovalStatus.REJECTED.value: control.on_reject,
            ApprovalStatus.EXPIRED.value: control.on_expire}.get(status)
    if step is None:
        hint = {ApprovalStatus.REJECTED.value: _DECIDED_FAILURES[FailReason.APPROVAL_REJECTED],
                ApprovalStatus.EXPIRED.value: _DECIDED_FAILURES[FailReason.APPROVAL_EXPIRED]}
        raise OperationRefused(
            f"run {run['id']} waits at seq {run['seq']} for approval {control.approval_id}, "
            f"which is {status} and names no step for that: continuing cannot go past it; "
            f"{hint.get(status, 'replay or branch it to ask again')}, or cancel it "
            "(onward runs cancel)")
    if step == run["step"]:
        return None
    return _Rewait(RunStatus.RUNNING, step, None)  # the step the decision names, now


def _check_continuable(conn: Connection, run: RowMapping, status: RunStatus) -> None:
    run_id = run["id"]
    if run["mode"] in {m.value for m in REPLAY_MODES}:
        raise OperationRefused(
            f"run {run_id} is {LaunchMode(run['mode']).child} of {run['parent_run_id']}: "
            "continue resumes original runs only; replay the parent again instead")
    if status in (RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.DIVERGED):
        raise OperationRefused(f"run {run_id} is {status.value}: a finished run is never "
                               "resumed; replay or branch it to take a new path")
    if status is RunStatus.WAITING:
        waiting_on = str(run["waiting_on"] or "")
        hint = (f"decide it: onward approvals approve|reject {waiting_on.split(':', 1)[1]}"
                if waiting_on.startswith("approval:")
                else f"send it what it waits for ({waiting_on})")
        raise OperationRefused(f"run {run_id} waits for a decision; continue would skip it, "
                               f"{hint}")
    if status is RunStatus.RUNNING and _leased(run, _now(conn)):
        raise OperationRefused(f"run {run_id} is running: worker {run['lease_owner']} holds "
                               f"step {run['step'] or '(start)'} until "
                               f"{run['lease_expires_at']:%H:%M:%S}")
    if status is RunStatus.RUNNING:
        _check_not_scheduled(conn, run)
    if status is RunStatus.FAILED:
        _check_failure(conn, run)


def _check_not_scheduled(conn: Connection, run: RowMapping) -> None:
    """A runnable run whose next delivery is due later (a durable timer, a retry backoff,
    the next status poll of an accepted effect, a hand-back's backoff) goes on by itself
    then; continue would cut the wait short (and, before, reset its attempt count)."""
    due = conn.execute(sa.select(outbox.c.due_at).where(
        outbox.c.run_id == run["id"], outbox.c.seq == run["seq"],
        outbox.c.due_at > sa.func.onward.now())).scalar()
    if due is None:
        return
    waiting_on = str(run["waiting_on"] or "")
    when = f"{due:%Y-%m-%d %H:%M:%S}"
    if waiting_on.startswith("timer:"):
        what = f"sleeps until {when} (a durable timer)"
    elif waiting_on.startswith("effect:"):
        what = f"waits for the provider to finish an accepted effect; it asks again at {when}"
    elif run["handbacks"]:
        what = (f"was handed back by a worker without its workflow or workflow version; it "
                f"is queued again at {when}")
    else:
        error = run["last_error"] or {}
        after = f" after {error.get('type')}: {str(error.get('message'))[:200]}" if error else ""
        what = (f"waits out a retry backoff until {when} (attempt {run['attempt']} of "
                f"{run['max_attempts']} of step {run['step'] or '(start)'}{after})")
    raise OperationRefused(f"run {run['id']} {what}; it goes on by itself then, and "
                           "continue would cut that short")


def _check_failure(conn: Connection, run: RowMapping) -> None:
    outcome = conn.execute(
        sa.select(checkpoints.c.outcome)
        .where(checkpoints.c.run_id == run["id"], checkpoints.c.seq == run["seq"])
    ).scalar()
    if outcome == OutcomeKind.FAIL.value:
        raise OperationRefused(f"run {run['id']} failed on purpose (its step returned "
                               "ctx.fail): that is its result; branch it to take another path")
    reason = (run["last_error"] or {}).get("reason")
    if reason is not None and reason not in _CONTINUABLE_FAILURES:
        hint = _DECIDED_FAILURES.get(reason, "replay or branch it instead")
        raise OperationRefused(f"run {run['id']} failed with {reason}, which continuing would "
                               f"only repeat: {hint}")


# -- cancel ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cancelled:
    run_id: UUID
    seq: int
    previous_status: RunStatus
    was_leased_by: str | None  # a worker mid-step: it ends the run at its next ctx call
    approvals_invalidated: list[UUID]
    requested: bool = False  # True: a worker ends the run once its effects are resolved
    effects_left_unknown: list[str] = field(default_factory=list)  # a person's decision


def cancel_txn(conn: Connection, keys: CheckpointKeys, actor: Actor, run_id: UUID,
               reason: str | None) -> Cancelled:
    """Stop a non-terminal run without abandoning an effect that may have reached the
    provider (docs/operating.md, "Cancel"):

    * a worker holds the step: record the request; that worker starts no new model call,
      read or provider call, resolves the step's effects and ends the run ``cancelled``;
    * nobody holds it but an effect's outcome is unknown: record the request and queue the
      run, so a worker reconciles the effect (lookup, status) and ends it, or parks it;
    * otherwise, and for a run a worker already parked after such a request (a person
      decides), end it now: outbox rows deleted, pending approvals invalidated, effects
      known never to have reached the provider closed ``unsent``."""
    actor.require(AuditAction.CANCEL)
    reason = require_reason(reason, AuditAction.CANCEL)
    run = lock_run_txn(conn, run_id, actor)
    status = RunStatus(run["status"])
    if status.terminal:
        raise OperationRefused(f"run {run_id} is already {status.value}")
    holder = (run["lease_owner"]
              if status is RunStatus.RUNNING and _leased(run, _now(conn)) else None)
    request = {"type": "Cancelled", "reason": FailReason.CANCELLED, "by": actor.name,
               "message": f"cancelled by {actor.name}: {reason}", "reason_text": reason}
    unknown = waits.unknown_effect(conn, run_id)
    decided = status is RunStatus.NEEDS_REVIEW and run["cancel_requested"] is not None
    cancel = _cancel_later if holder is not None or (unknown is not None and not decided) \
        else _cancel_now
    return cancel(conn, keys, actor, run, status=status, request=request, reason=reason,
                  holder=holder, unknown=unknown)


def _cancel_later(conn: Connection, keys: CheckpointKeys, actor: Actor, run: RowMapping, *,
                  status: RunStatus, request: dict[str, Any], reason: str, holder: str | None,
                  unknown: str | None) -> Cancelled:
    """A worker holds the step, or an effect's outcome is unknown and nobody decided yet:
    record the request (and queue the run when nobody holds it); a worker ends it."""
    run_id = run["id"]
    _request_cancel(conn, run, status, request, queue=holder is None)
    record_txn(conn, keys, actor, AuditRecord(
        AuditAction.CANCEL, AuditOutcome.DONE, reason, run_id=run_id,
        before_seq=run["seq"], after_seq=run["seq"],
        details={"previous_status": status.value, "step": run["step"],
                 "lease_holder": holder, "requested": True, "unknown_effect": unknown}))
    return Cancelled(run_id, run["seq"], status, holder, [], requested=True)


def _cancel_now(conn: Connection, keys: CheckpointKeys, actor: Actor, run: RowMapping, *,
                status: RunStatus, request: dict[str, Any], reason: str, holder: str | None,
                unknown: str | None) -> Cancelled:
    """End the run now: nothing runs it, and no effect's outcome is unknown (or a person
    decides on one after a worker parked the run)."""
    run_id = run["id"]
    left = _unknown_effects(conn, run_id) if unknown is not None else []
    invalidated = _end_cancelled(conn, run_id, status, request, reason)
    record_txn(conn, keys, actor, AuditRecord(
        AuditAction.CANCEL, AuditOutcome.DONE, reason, run_id=run_id,
        before_seq=run["seq"], after_seq=run["seq"],
        details={"previous_status": status.value, "step": run["step"],
                 "lease_holder": holder, "effects_left_unknown": left,
                 "approvals_invalidated": [str(a) for a in invalidated]}))
    return Cancelled(run_id, run["seq"], status, holder, invalidated,
                     effects_left_unknown=left)


def _request_cancel(conn: Connection, run: RowMapping, status: RunStatus,
                    request: dict[str, Any], *, queue: bool) -> None:
    """Record the request; with ``queue``, make the run runnable and send it to a worker
    (the worker resolves its effects and ends it without running the step)."""
    values: dict[str, Any] = {"cancel_requested": request, "updated_at": sa.func.onward.now()}
    if queue:
        values.update(status=RunStatus.RUNNING.value, parked_reason=None, waiting_on=None,
                      wait_until=None, lease_owner=None, lease_expires_at=None,
                      attempt=sa.func.least(runs.c.attempt, runs.c.max_attempts - 1))
    conn.execute(runs.update().where(runs.c.id == run["id"], runs.c.status == status.value)
                 .values(**values))
    if queue:
        queue_step_txn(conn, run["id"], run["seq"])


_UNKNOWN_EFFECTS = sql.text("unknown_effects")


def _unknown_effects(conn: Connection, run_id: UUID) -> list[str]:
    """The run's effects whose outcome at the provider is unknown."""
    rows = conn.execute(_UNKNOWN_EFFECTS, {"run_id": run_id}).all()
    return [f"{r.effect_type} {r.effect_id} ({r.status})" for r in rows]


def _end_cancelled(conn: Connection, run_id: UUID, status: RunStatus, request: dict[str, Any],
                   reason: str) -> list[UUID]:
    conn.execute(
        runs.update().where(runs.c.id == run_id, runs.c.status == status.value)
        .values(status=RunStatus.CANCELLED.value, finished_at=sa.func.onward.now(),
                updated_at=sa.func.onward.now(), waiting_on=None, wait_until=None,
                lease_owner=None, lease_expires_at=None, last_error=request)
    )
    conn.execute(outbox.delete().where(outbox.c.run_id == run_id))
    waits.close_unsent(conn, run_id, "run cancelled")
    return list(conn.execute(
        approvals.update()
        .where(approvals.c.run_id == run_id, approvals.c.status == ApprovalStatus.PENDING.value)
        .values(status=ApprovalStatus.INVALIDATED.value, decided_by=str(request["by"]),
                decided_at=sa.func.onward.now(), comment=f"run cancelled: {reason}")
        .returning(approvals.c.id)
    ).scalars())


# -- approve / reject -----------------------------------------------------------------------
def decide_approval_txn(conn: Connection, keys: CheckpointKeys, actor: Actor,
                        approval_id: UUID, *, approve: bool, artifact_hash: str,
                        comment: str | None) -> waits.Approval:
    """``waits.record_decision_txn`` plus its audit row. Deciding always needs the approve
    permission (checked first); the approval's approvers list then says who among those may
    decide, by name or by one of the actor's approver roles."""
    action = AuditAction.APPROVE if approve else AuditAction.REJECT
    actor.require(action)
    approval = waits.get_approval_txn(conn, approval_id)
    lock_run_txn(conn, approval.run_id, actor)
    decided = waits.record_decision_txn(conn, keys, approval_id, approve=approve,
                                        actor=actor.name,
                                        roles=actor.approver_roles,
                                        artifact_hash=artifact_hash, comment=comment)
    # signed where the decision is taken: a resumed step acts on it only if it verifies
    conn.execute(approvals.update().where(approvals.c.id == approval_id).values(
        decision_mac=keys.sign(signed.approval_decision(vars(decided)))))
    record_txn(conn, keys, actor, AuditRecord(
        action, AuditOutcome.DONE, comment, run_id=approval.run_id, approval_id=approval_id,
        before_seq=approval.seq, after_seq=approval.seq,
        details={"decided_by": actor.name, "approver_roles": list(actor.approver_roles),
                 "action": approval.action, "artifact_hash": artifact_hash}))
    return decided


# -- repeat an external effect (the ledger's half; tasks/operator.py calls the tool) --------
@dataclass(frozen=True)
class RepeatStarted:
    """A repeat attempt recorded (committed) before the tool is called."""

    effect: Effect
    attempt: int
    number: int  # 1 for the first repeat of this effect
    idempotency_key: str


def repeat_key(effect_id: str, number: int) -> str:
    """The new recorded key of the ``number``-th repeat: ``sha256(effect_id:repeat:n)``."""
    return hashlib.sha256(f"{effect_id}:repeat:{number}".encode()).hexdigest()


def get_effect_txn(conn: Connection, effect_type: str, effect_id: str, *,
                   lock: bool = False) -> Effect:
    query = sa.select(effects).where(effects.c.effect_type == effect_type,
                                     effects.c.effect_id == effect_id)
    row = conn.execute(query.with_for_update() if lock else query).mappings().first()
    if row is None:
        raise UnknownEffect(f"no effect {effect_type} {effect_id}")
    return Effect.from_row(dict(row))


def begin_repeat_txn(conn: Connection, keys: CheckpointKeys, actor: Actor, effect_type: str,
                     effect_id: str, reason: str | None,
                     plan: dict[str, Any]) -> RepeatStarted:
    """Record the repeat attempt (kind ``repeat``, its own key) and its audit row."""
    actor.require(AuditAction.REPEAT_EFFECT)
    reason = require_reason(reason, AuditAction.REPEAT_EFFECT)
    effect = get_effect_txn(conn, effect_type, effect_id, lock=True)
    if conn.execute(sa.select(effects.c.tenant_id).where(
            effects.c.effect_type == effect_type, effects.c.effect_id == effect_id)
    ).scalar_one() != actor.tenant_id:
        raise OperationRefused(f"effect {effect_id[:16]}… belongs to another tenant")
    _check_repeat_plan(conn, effect, plan)
    check_attempts_txn(conn, keys, effect)  # a deleted repeat would reuse its key
    if effect.payload is None:
        raise OperationRefused(f"effect {effect_type} {effect_id[:16]}… has no stored payload "
                               "(its tool keeps payloads out of the ledger): nothing to repeat")
    number = 1 + conn.execute(
        sa.select(sa.func.count()).select_from(effect_attempts)
        .where(effect_attempts.c.effect_type == effect_type,
               effect_attempts.c.effect_id == effect_id,
               effect_attempts.c.kind == EffectAttemptKind.REPEAT.value)
    ).scalar_one()
    key = repeat_key(effect_id, number)
    attempt = conn.execute(
        effects.update().where(effects.c.effect_type == effect_type,
                               effects.c.effect_id == effect_id)
        .values(attempts=effects.c.attempts + 1, updated_at=sa.func.onward.now())
        .returning(effects.c.attempts)
    ).scalar_one()
    conn.execute(effect_attempts.insert().values(
        effect_type=effect_type, effect_id=effect_id, attempt=attempt,
        kind=EffectAttemptKind.REPEAT.value, worker=f"operator:{actor.name}",
        lease_epoch=None, idempotency_key=key))
    record_txn(conn, keys, actor, AuditRecord(
        AuditAction.REPEAT_EFFECT, AuditOutcome.DONE, reason, run_id=effect.run_id,
        effect_id=effect_id, before_seq=effect.seq, after_seq=effect.seq,
        details={**_audited(plan, effect), "effect_type": effect_type, "attempt": attempt,
                 "repeat": number, "idempotency_key": key, "repeat_of": effect_id}))
    return RepeatStarted(effect, attempt, number, key)


def _audited(plan: dict[str, Any], effect: Effect) -> dict[str, Any]:
    """A confirmed plan as its audit row keeps it: with the effect's payload and recipient
    as the ledger stores them. The person confirmed them opened (``Ledger`` shows sealed
    values opened to an admin); a sealed payload stays sealed in the audit log too."""
    return {**plan, **{k: getattr(effect, k) for k in ("payload", "recipient") if k in plan}}


def _check_repeat_plan(conn: Connection, effect: Effect, plan: dict[str, Any]) -> None:
    """The confirmed plan must still describe the effect (its attempt count, as shown) and
    must not send a replay's effect where its run never sends (docs/design.md section 8)."""
    shown = plan.get("attempts")
    if not isinstance(shown, int) or isinstance(shown, bool):
        raise OperationRefused("a repeat must carry the attempt count of the plan that was "
                               "confirmed (plan['attempts'])")
    if shown != effect.attempts:
        raise OperationRefused(
            f"effect {effect.effect_id[:16]}… changed since the plan you confirmed (it showed "
            f"{shown} attempts, it now has {effect.attempts}: someone repeated or reconciled "
            "it meanwhile); look at it again (onward effects show) before repeating")
    mode = conn.execute(sa.select(runs.c.mode).where(runs.c.id == effect.run_id)).scalar()
    if mode == LaunchMode.EVIDENCE.value:
        raise OperationRefused(f"effect {effect.effect_id[:16]}… belongs to an evidence "
                               "replay, which never calls a provider")
    if mode == LaunchMode.SIMULATION.value and plan.get("sends_to") != "sandbox":
        raise OperationRefused(f"effect {effect.effect_id[:16]}… belongs to a simulation: "
                               "a repeat of it may only call the tool's sandbox")


def finish_repeat_txn(conn: Connection, keys: CheckpointKeys, started: RepeatStarted, *,
                      outcome: EffectAttemptOutcome, provider_ref: str | None,
                      result: dict[str, Any] | None,
                      error: dict[str, Any] | None) -> Effect:
    """Record what the provider answered to the repeat. A completed repeat of an effect whose
    outcome was never known (or failed) completes the effect with the new object."""
    effect = started.effect
    current = get_effect_txn(conn, effect.effect_type, effect.effect_id, lock=True)
    completes = (outcome == EffectAttemptOutcome.COMPLETED
                 and current.status is not EffectStatus.COMPLETED)
    result = seal_effect_result(keys.crypt, effect, result)  # sealed as a worker's answer is
    conn.execute(
        effect_attempts.update()
        .where(effect_attempts.c.effect_type == effect.effect_type,
               effect_attempts.c.effect_id == effect.effect_id,
               effect_attempts.c.attempt == started.attempt)
        .values(ended_at=sa.func.onward.now(), outcome=outcome, provider_ref=provider_ref,
                error=seal_effect_error(keys.crypt, effect, error, started.attempt),
                mac=keys.sign(signed.effect_attempt(
                    effect.effect_type, effect.effect_id, started.attempt,
                    EffectAttemptKind.REPEAT.value, started.idempotency_key, outcome,
                    provider_ref)))
    )
    if completes:
        conn.execute(
            effects.update()
            .where(effects.c.effect_type == effect.effect_type,
                   effects.c.effect_id == effect.effect_id)
            .values(status=EffectStatus.COMPLETED.value, provider_ref=provider_ref,
                    result=result, error=None, completed_at=sa.func.onward.now(),
                    updated_at=sa.func.onward.now(),
                    outcome_mac=keys.sign(signed.effect_outcome(
                        effect.effect_type, effect.effect_id, EffectStatus.COMPLETED.value,
                        provider_ref, result)))
        )
    return get_effect_txn(conn, effect.effect_type, effect.effect_id)


# -- resolve an effect by hand: what a person found at the provider -------------------------
class Finding(StrEnum):
    """What a person found at the provider for an effect whose outcome onward cannot learn."""

    COMPLETED = "completed"  # the provider holds the object: its reference (and result)
    NOT_SENT = "not_sent"  # the provider holds nothing for the effect's key: send it again


_CALL_UNKNOWN = sql.text("effect_call_unknown")
_CALL_MAY_LAND = sql.text("effect_call_may_land")


@dataclass(frozen=True)
class Landing:
    """How long a call of an effect may still land at the provider, for a ``not_sent``
    finding (docs/operating.md, "Resolve an effect by hand"): ``after_s`` past the time its
    worker covered it for, for a call never seen to end (its time limit and the lease
    margin from its start; ``default_cover_s`` when none was recorded), and ``after_s``
    past its end for a call that ended with outcome unknown (its client gave up; the
    request may still be queued or processing there); unless the person says it cannot
    (``allowed``, recorded in the audit row)."""

    after_s: float
    default_cover_s: float
    allowed: bool = False


def resolve_plan(effect: Effect, finding: Finding, provider_ref: str | None,
                 result: dict[str, Any] | None) -> dict[str, Any]:
    """What ``resolve_effect_txn`` will record, shown before it is confirmed; confirming it
    carries the effect's attempt count as shown (refused if the effect changed since)."""
    then = ("the step that asked for it gets this result when the run goes on; nothing is "
            "sent" if finding is Finding.COMPLETED else
            "the effect is closed unsent; when the run goes on, its step sends it again "
            "with the SAME key (make sure the provider holds nothing for it)")
    return {"effect_type": effect.effect_type, "effect_id": effect.effect_id,
            "run_id": str(effect.run_id), "seq": effect.seq, "command_id": effect.command_id,
            "recipient": effect.recipient, "payload": effect.payload,
            "status": effect.status.value, "attempts": effect.attempts,
            "finding": finding.value, "provider_ref": provider_ref, "result": result,
            "then": then}


def resolve_effect_txn(conn: Connection, keys: CheckpointKeys, actor: Actor, effect_type: str,
                       effect_id: str, reason: str | None, plan: dict[str, Any], *,
                       finding: Finding, landing: Landing, provider_ref: str | None = None,
                       result: dict[str, Any] | None = None) -> Effect:
    """Record what a person found at the provider for an effect whose outcome is unknown
    (docs/operating.md, "Resolve an effect by hand"): ``completed`` with the provider's
    reference and result, or ``not_sent`` (closed ``unsent``: the run's step sends it again
    with the same key; refused while a call of it may still land, see ``Landing``). An
    attempt of kind ``resolve`` and an audit row record who said so and why; the run is
    not moved (``continue`` resumes it)."""
    actor.require(AuditAction.RESOLVE_EFFECT)
    reason = require_reason(reason, AuditAction.RESOLVE_EFFECT)
    found = get_effect_txn(conn, effect_type, effect_id)
    run = lock_run_txn(conn, found.run_id, actor)  # run before effect, as everywhere
    effect = get_effect_txn(conn, effect_type, effect_id, lock=True)
    _check_resolvable(conn, run, effect, plan, finding, provider_ref)
    if finding is Finding.NOT_SENT and not landing.allowed:
        _check_landed(conn, effect, landing)
    attempt = _resolve_attempt(conn, keys, actor, effect_type, effect_id,
                               finding=finding, provider_ref=provider_ref)
    stored = (seal_effect_result(keys.crypt, effect, result or {})  # as a worker's answer is
              if finding is Finding.COMPLETED else None)
    _close_resolved(conn, keys, actor, effect, finding=finding, provider_ref=provider_ref,
                    result=stored)
    record_txn(conn, keys, actor, AuditRecord(
        AuditAction.RESOLVE_EFFECT, AuditOutcome.DONE, reason, run_id=effect.run_id,
        effect_id=effect_id, before_seq=run["seq"], after_seq=run["seq"],
        details={**_audited(plan, effect), "attempt": attempt,
                 "previous_status": effect.status.value,
                 **({"allow_in_flight": True} if landing.allowed else {}),
                 **({"result": stored} if plan.get("result") is not None else {})}))
    return get_effect_txn(conn, effect_type, effect_id)


def _resolve_attempt(conn: Connection, keys: CheckpointKeys, actor: Actor, effect_type: str,
                     effect_id: str, *, finding: Finding, provider_ref: str | None) -> int:
    """Count the person's finding as the effect's next attempt, of kind ``resolve``, signed
    like every attempt as it ends; return its number."""
    attempt: int = conn.execute(
        effects.update().where(effects.c.effect_type == effect_type,
                               effects.c.effect_id == effect_id)
        .values(attempts=effects.c.attempts + 1, updated_at=sa.func.onward.now())
        .returning(effects.c.attempts)
    ).scalar_one()
    outcome = (EffectAttemptOutcome.FOUND if finding is Finding.COMPLETED
               else EffectAttemptOutcome.MISSING)
    kind = EffectAttemptKind.RESOLVE.value
    conn.execute(effect_attempts.insert().values(  # signed like every attempt as it ends
        effect_type=effect_type, effect_id=effect_id, attempt=attempt, kind=kind,
        worker=f"operator:{actor.name}", lease_epoch=None, idempotency_key=effect_id,
        ended_at=sa.func.onward.now(), outcome=outcome, provider_ref=provider_ref,
        mac=keys.sign(signed.effect_attempt(effect_type, effect_id, attempt, kind, effect_id,
                                            outcome, provider_ref))))
    return attempt


def _close_resolved(conn: Connection, keys: CheckpointKeys, actor: Actor, effect: Effect, *,
                    finding: Finding, provider_ref: str | None,
                    result: Any) -> None:
    """Close the effect as the person found it: ``completed`` with the provider's reference
    and ``result`` as stored (sealed with keys; its outcome signed), or ``unsent``."""
    effect_type, effect_id = effect.effect_type, effect.effect_id
    if finding is Finding.COMPLETED:
        values: dict[str, Any] = {
            "status": EffectStatus.COMPLETED.value, "provider_ref": provider_ref,
            "result": result, "error": None, "reconciled": True,
            "outcome_mac": keys.sign(signed.effect_outcome(
                effect_type, effect_id, EffectStatus.COMPLETED.value, provider_ref, result))}
    else:
        values = {"status": EffectStatus.UNSENT.value,
                  "error": {**(effect.error or {}),
                            "closed_by": f"resolved by {actor.name}: not sent"}}
    conn.execute(effects.update().where(effects.c.effect_type == effect_type,
                                        effects.c.effect_id == effect_id)
                 .values(**values, completed_at=sa.func.onward.now(),
                         updated_at=sa.func.onward.now()))


def _check_resolvable(conn: Connection, run: RowMapping, effect: Effect, plan: dict[str, Any],
                      finding: Finding, provider_ref: str | None) -> None:
    """Only an effect whose outcome onward cannot know may be resolved by a person, and
    only as it stands in the plan that was confirmed, while no worker holds its step."""
    name = f"effect {effect.effect_type} {effect.effect_id[:16]}…"
    shown = plan.get("attempts")
    if not isinstance(shown, int) or isinstance(shown, bool) or shown != effect.attempts:
        raise OperationRefused(
            f"{name} changed since the plan you confirmed (it showed {shown} attempts, it now "
            f"has {effect.attempts}): look at it again (onward effects show)")
    if run["mode"] == LaunchMode.EVIDENCE.value:
        raise OperationRefused(f"{name} belongs to an evidence replay, which calls nothing")
    if RunStatus(run["status"]) is RunStatus.RUNNING and _leased(run, _now(conn)):
        raise OperationRefused(f"run {run['id']} is running: worker {run['lease_owner']} holds "
                               "its step and may be asking the provider right now; resolve "
                               "the effect once the run is parked")
    if effect.status not in (EffectStatus.PENDING, EffectStatus.ACCEPTED):
        raise OperationRefused(f"{name} is {effect.status.value}: its outcome is known")
    if effect.status is EffectStatus.PENDING and not conn.execute(_CALL_UNKNOWN, {
            "effect_type": effect.effect_type, "effect_id": effect.effect_id}).scalar():
        raise OperationRefused(
            f"{name} cannot have reached the provider (never sent, refused each time, or "
            "found missing since): the run's step sends it with the same key when the run "
            "goes on; there is nothing to resolve")
    if finding is Finding.NOT_SENT and effect.status is EffectStatus.ACCEPTED:
        raise OperationRefused(
            f"{name} was accepted by the provider (reference {effect.provider_ref}): it "
            "reached the provider; record what the job came to (completed), or continue the "
            "run to poll it again")
    if finding is Finding.COMPLETED and not (provider_ref or "").strip():
        raise InvalidInput("a completed effect needs the provider's reference of the object "
                           "you found (--provider-ref)")


def _check_landed(conn: Connection, effect: Effect, landing: Landing) -> None:
    """A person may say ``not_sent`` only once no call of the effect can still land: an
    attempt never seen to end (its worker died, was stopped or lost its lease mid-call) may
    land until ``landing.after_s`` past its cover, one its worker marked in flight past its
    time limit at any time, and a call whose client gave up (outcome unknown: a timeout, a
    dropped connection) until ``landing.after_s`` past its end, whatever a lookup found
    since. Before then the provider may not show it yet, and the run would send it again."""
    row = conn.execute(_CALL_MAY_LAND, {
        "effect_type": effect.effect_type, "effect_id": effect.effect_id,
        "default_cover_s": landing.default_cover_s,
        "landing_s": landing.after_s}).mappings().first()
    if row is None or not (row["overran"] or row["lands_until"] > row["now"]):
        return
    name = f"effect {effect.effect_type} {effect.effect_id[:16]}…"
    started = f"{row['started_at']:%Y-%m-%d %H:%M:%S %Z}"
    until = f"{row['lands_until']:%Y-%m-%d %H:%M:%S %Z}"
    setting = f"ONWARD_CALL_LANDING_S={landing.after_s:g}s"
    override = ("; if you know it cannot land any more ({}), say so with --allow-in-flight "
                "(recorded in the audit row); a call that lands is resolved completed")
    if not row["open"]:
        raise OperationRefused(
            f"{name}: attempt {row['attempt']}'s {row['kind']} (started {started}) ended at "
            f"{row['ended_at']:%Y-%m-%d %H:%M:%S %Z} with outcome unknown (its client gave "
            "up, or its answer came after its lease was lost; the provider may still have the "
            "request queued or in progress): it may still "
            f"land at the provider until {until} ({setting} after it ended), after you "
            "looked; say not_sent after that time if the provider still holds nothing"
            + override.format("the provider shows it refused or dropped the request"))
    call = f"{name}: attempt {row['attempt']}'s call (started {started}) was never seen to end"
    gone = override.format("its worker process is gone and the provider shows no such "
                           "request")
    if row["overran"]:
        raise OperationRefused(
            f"{call}, and its worker marked it still in flight past its time limit: it may "
            "land at the provider at any time, after you looked" + gone)
    raise OperationRefused(
        f"{call}: it may still land at the provider until {until} (its time limit and lease "
        f"margin, then {setting}), after you looked; say not_sent after that time if the "
        "provider still holds nothing" + gone)
