"""Turning a wait outcome into the ledger's Wait: its control (ledger/wait_control.py,
covered by the checkpoint MAC), and for approvals the bound artifact hash."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from uuid6 import uuid7

from ledger.checkpoints import canonical_json, sha256_hex
from ledger.exceptions import InvalidInput
from ledger.steps import ApprovalRequest, Wait
from ledger.wait_control import ApprovalControl, SignalControl, TimerControl
from tasks.exceptions import OutcomeError
from tasks.outcomes import AskApproval, Sleep, WaitSignal
from tasks.workflow import Step, Workflow

__all__ = ["artifact_hash", "aware", "build_wait"]


def artifact_hash(artifact: Any) -> str:
    """sha256 of the artifact's canonical JSON: what an approver's decision is bound to."""
    try:
        return sha256_hex(canonical_json(artifact))
    except InvalidInput as exc:
        raise OutcomeError(f"approval artifact is not plain JSON: {exc}") from exc


def aware(when: datetime, what: str) -> datetime:
    """``when`` if it names an instant; a naive datetime is refused, never guessed."""
    if when.tzinfo is None or when.utcoffset() is None:
        raise OutcomeError(
            f"{what} {when.isoformat()} has no time zone, so it names no instant; onward "
            "compares it with the database's clock and will not guess a zone: give an aware "
            "datetime (datetime(..., tzinfo=UTC), or ctx.now() + timedelta(...))")
    return when


def build_wait(outcome: AskApproval | WaitSignal | Sleep, workflow: Workflow[Any],
               step: Step, now: datetime) -> Wait:
    """``now`` is the step's clock (tasks/clock.py): the database's time, so the expiry,
    timeout or wake-up recorded here (and MAC'd in the control) is the one the ledger
    compares with ``onward.now()``."""
    if isinstance(outcome, AskApproval):
        return _approval_wait(outcome, step, now)
    if isinstance(outcome, WaitSignal):
        return _signal_wait(outcome, step, now)
    until = aware(outcome.until, f"step {step.name}: sleep until")
    control = TimerControl(kind="timer", until=until.isoformat(), then=outcome.then)
    return Wait(waiting_on=f"timer:{until.isoformat()}", control=control, due_at=until)


def _approval_wait(outcome: AskApproval, step: Step, now: datetime) -> Wait:
    if not outcome.action:
        raise OutcomeError(f"step {step.name}: an approval needs an action name")
    if outcome.expires_in.total_seconds() <= 0:
        raise OutcomeError(f"step {step.name}: approval expiry must be in the future")
    approval_id = uuid7()
    digest = artifact_hash(outcome.artifact)
    control = ApprovalControl(kind="approval", approval_id=str(approval_id),
                              action=outcome.action, artifact_hash=digest, then=outcome.then,
                              on_reject=outcome.on_reject, on_expire=outcome.on_expire)
    return Wait(
        waiting_on=f"approval:{approval_id}", control=control,
        approval=ApprovalRequest(approval_id, outcome.action, outcome.artifact, digest,
                                 list(outcome.approvers), now + outcome.expires_in, now),
    )


def _signal_wait(outcome: WaitSignal, step: Step, now: datetime) -> Wait:
    if not outcome.name:
        raise OutcomeError(f"step {step.name}: a signal wait needs a name")
    timeout_at = now + outcome.timeout if outcome.timeout is not None else None
    control = SignalControl(
        kind="signal", name=outcome.name, then=outcome.then, on_timeout=outcome.on_timeout,
        timeout_at=timeout_at.isoformat() if timeout_at else None,
        # a replay or branch waits as long, from its own start
        timeout_s=outcome.timeout.total_seconds() if outcome.timeout is not None else None)
    return Wait(waiting_on=f"signal:{outcome.name}", control=control, wait_until=timeout_at)
