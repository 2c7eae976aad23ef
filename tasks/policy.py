"""Time-bound policy, re-checked after the claim and before a step runs (docs/design.md
section 7, step 6): budgets, the run's deadline, and that a step after a wait follows what
ended the wait as its MAC'd control signs it: the approval it acts on, the signal that
resumed it (consumed at that seq, and not consumed by the run before), the timeout or the
timer's time it runs after. A run made runnable in the database without its event (its row
set ``running``, its outbox row made due) parks ``integrity`` before its step runs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from ledger import signed
from ledger.approval_start import recorded_signed
from ledger.checkpoints import CheckpointKeys
from ledger.exceptions import IntegrityViolation, MalformedControl
from ledger.runs import Budgets
from ledger.signal_order import carried_marks, replayed
from ledger.steps import Budget, BudgetDefaults, Claim
from ledger.vocabulary import ApprovalStatus, FailReason, ParkReason
from ledger.wait_control import ApprovalControl, SignalControl, TimerControl, parse_control
from ledger.waits import WaitStore, check_terms
from tasks.control import FailFor, ParkFor

__all__ = ["Limits", "recheck", "signal_marks"]


@dataclass(frozen=True)
class Limits:
    """The run's effective limits: its own, else its workflow's defaults."""

    attempts: int | None
    tokens: int | None
    cost_usd: Decimal | None
    deadline_at: datetime | None

    @classmethod
    def of(cls, budget: Budget, defaults: Budgets | None) -> Limits:
        defaults = defaults or Budgets()
        deadline = budget.deadline_at
        if deadline is None and defaults.deadline is not None:
            deadline = budget.run_created_at + defaults.deadline
        cost = budget.cost_usd
        if cost is None and defaults.cost_usd is not None:
            cost = Decimal(str(defaults.cost_usd))
        return cls(
            attempts=budget.attempts if budget.attempts is not None else defaults.attempts,
            tokens=budget.tokens if budget.tokens is not None else defaults.tokens,
            cost_usd=cost,
            deadline_at=deadline,
        )

    def defaults_for_run(self) -> BudgetDefaults:
        """Written on the run at its first commit, so the reaper can enforce the deadline."""
        return BudgetDefaults(
            attempts=self.attempts, tokens=self.tokens,
            cost_usd=float(self.cost_usd) if self.cost_usd is not None else None,
            deadline_at=self.deadline_at,
        )

    def tokens_left(self, budget: Budget) -> int | None:
        return None if self.tokens is None else self.tokens - budget.used_tokens

    def cost_left(self, budget: Budget) -> float | None:
        return None if self.cost_usd is None else float(self.cost_usd - budget.used_cost_usd)


def recheck(claim: Claim, limits: Limits, waits: WaitStore,
            keys: CheckpointKeys) -> FailFor | ParkFor | None:
    """Refuse to start a step that the run's budgets, deadline or approval no longer allow."""
    budget = claim.budget
    spent = budget.spent()
    if limits.deadline_at is not None and claim.claimed_at >= limits.deadline_at:
        return FailFor(FailReason.DEADLINE_EXCEEDED,
                       f"the run's deadline {limits.deadline_at:%Y-%m-%d %H:%M:%S} has passed",
                       spent)
    if limits.attempts is not None and budget.attempts_total > limits.attempts:
        return FailFor(FailReason.BUDGET_EXHAUSTED,
                       f"attempt budget spent: {budget.attempts_total - 1} step executions of "
                       f"{limits.attempts} allowed", spent)
    if limits.tokens is not None and budget.used_tokens >= limits.tokens:
        return FailFor(FailReason.BUDGET_EXHAUSTED,
                       f"token budget spent: {budget.used_tokens} of {limits.tokens}", spent)
    if limits.cost_usd is not None and budget.used_cost_usd >= limits.cost_usd:
        return FailFor(FailReason.BUDGET_EXHAUSTED,
                       f"cost budget spent: ${budget.used_cost_usd} of ${limits.cost_usd}", spent)
    return _recheck_wait(claim, waits, keys)


def _recheck_wait(claim: Claim, waits: WaitStore,
                  keys: CheckpointKeys) -> FailFor | ParkFor | None:
    """After a wait, the run's step must be the continuation its MAC'd control names for
    what happened: an approval's ``then`` only when approved (and unexpired, and for the
    artifact asked about; unexpired when the approved step first started),
    ``on_reject`` only when rejected, ``on_expire`` only when
    expired; a timer's ``then`` only from its time on; a signal wait's ``on_timeout`` only
    once it timed out (its ``then`` needs the signal: ``signal_marks``). An approved or
    rejected decision must verify against the MAC written where it was taken: one set in the
    database (status 'approved') parks the run, and so does a run set running at an
    approval's ``then`` with no decision taken."""
    try:
        control = parse_control(claim.checkpoint.control if claim.checkpoint else None,
                                f"checkpoint {claim.seq} of run {claim.run_id}")
    except MalformedControl as exc:
        return ParkFor(ParkReason.INVALID_CONTROL, type(exc).__name__, str(exc))
    if control is None:
        return None
    allowed = control.continuations
    if claim.step not in allowed:
        return ParkFor(ParkReason.INTEGRITY, "IntegrityViolation",
                       f"run is routed to step {claim.step!r}, which checkpoint {claim.seq}'s "
                       f"wait does not allow ({sorted(str(a) for a in allowed)})")
    if isinstance(control, TimerControl):
        return _recheck_timer(claim, control)
    if isinstance(control, SignalControl):
        return _recheck_timeout(claim, control)
    return _recheck_approval(claim, control, waits, keys)


def _recheck_approval(claim: Claim, control: ApprovalControl, waits: WaitStore,
                      keys: CheckpointKeys) -> FailFor | ParkFor | None:
    """The approval's status as signed, and the step it allows the run to be at."""
    approval = waits.approval_for_step(control.approval_id, claim.run_id, claim.seq)
    status = _approval_status(approval)
    refused = _check_approval_macs(keys, approval, status)
    if refused is not None:
        return refused
    if (approval is not None and status == ApprovalStatus.APPROVED
            and claim.step == control.then):
        return _recheck_approved(claim, control, approval, waits, keys)
    return _recheck_decided(claim, control, status, approval)


def _approval_status(approval: dict[str, Any] | None) -> str:
    """Its status, ``missing`` with none; a pending one past its time counts as expired."""
    status = approval["status"] if approval else "missing"
    if status == ApprovalStatus.PENDING and approval is not None and not approval["unexpired"]:
        status = ApprovalStatus.EXPIRED  # the reaper has not swept it yet
    return status


def _check_approval_macs(keys: CheckpointKeys, approval: dict[str, Any] | None,
                         status: str) -> ParkFor | None:
    """The asking step's terms, and a decision, count only as they were signed."""
    if approval is not None:
        try:  # who might decide and until when count only as the asking step signed them
            check_terms(keys, approval)
        except IntegrityViolation as exc:
            return ParkFor(ParkReason.INTEGRITY, "IntegrityViolation", str(exc))
    if approval is not None and status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED):
        try:  # a person's decision counts only as it was signed where it was taken
            keys.check(signed.approval_decision(approval), approval["decision_mac"],
                       f"the decision on approval {approval['id']} ({status} by "
                       f"{approval['decided_by']})")
        except IntegrityViolation as exc:
            return ParkFor(ParkReason.INTEGRITY, "IntegrityViolation", str(exc))
    return None


def _recheck_decided(claim: Claim, control: ApprovalControl, status: str,
                     approval: dict[str, Any] | None) -> ParkFor | None:
    """A run not at an approved ``then``: only the step its decision names is allowed, and
    the expiry step only once the expiry its terms sign has passed (the ``expired`` status
    is the reaper's, unsigned: set early in the database, on a pending or even an approved
    approval, it would turn a person's decision into its expiry)."""
    decided: dict[str, Any] = {ApprovalStatus.REJECTED: control.on_reject,
                               ApprovalStatus.EXPIRED: control.on_expire}
    if status == ApprovalStatus.EXPIRED and approval is not None and approval["unexpired"] \
            and not claim.launch.evidence:  # a replay follows its source's past decision
        expires = f"{approval['expires_at']:%Y-%m-%d %H:%M:%S}"
        return ParkFor(ParkReason.INTEGRITY, "IntegrityViolation",
                       f"approval {approval['id']} is marked expired, but it expires only at "
                       f"{expires} (its signed terms): the run was routed to step "
                       f"{claim.step!r} outside onward, and the step did not run")
    if status in decided and claim.step == decided[status]:
        return None
    if claim.step == control.then:  # only approve resumes it there: nobody decided
        return ParkFor(ParkReason.INTEGRITY, "IntegrityViolation",
                       f"run {claim.run_id} is at step {claim.step!r}, which only approving "
                       f"approval {control.approval_id} resumes, but that approval is "
                       f"{status}: the run was made runnable outside onward, and the step "
                       "did not run")
    return ParkFor(ParkReason.INTEGRITY, "IntegrityViolation",
                   f"run is routed to step {claim.step!r} after approval "
                   f"{control.approval_id}, which is {status}: that is not the step "
                   f"checkpoint {claim.seq}'s wait names for it (the run's row was edited "
                   "outside onward)")


def _recheck_approved(claim: Claim, control: ApprovalControl, approval: dict[str, Any],
                      waits: WaitStore, keys: CheckpointKeys) -> FailFor | ParkFor | None:
    if approval["artifact_hash"] != control.artifact_hash:
        return ParkFor(ParkReason.INTEGRITY, "IntegrityViolation",
                       f"approval {approval['id']} is for artifact "
                       f"{approval['artifact_hash'][:12]}…, the checkpoint asked about "
                       f"{control.artifact_hash[:12]}…")
    if claim.launch.evidence:
        return None  # an evidence replay follows a decision taken in the past, as it was
    # An approval authorises the approved step that STARTS before it expires: a retry (or a
    # continue) of a step whose first attempt began in time goes on, finding the effects
    # it recorded, so what it paid is never lost nor paid twice (docs/operating.md).
    started = approval["step_started_at"] or claim.claimed_at
    if started >= approval["expires_at"]:
        expired_at = f"{approval['expires_at']:%Y-%m-%d %H:%M:%S}"
        return FailFor(FailReason.APPROVAL_EXPIRED,
                       f"approval {approval['id']} expired at {expired_at} before the approved "
                       f"step {claim.step} first started (at {started:%Y-%m-%d %H:%M:%S}); "
                       "nothing it would do was done: replay or branch the run from its "
                       "approval wait to ask again", {})
    # When the first attempt began is unsigned (step_attempts): a retry after the expiry
    # also needs what an attempt in time left signed at this seq (ledger/approval_start.py)
    if claim.claimed_at >= approval["expires_at"] and \
            not recorded_signed(waits.conn, keys, claim.run_id, claim.seq):
        expired_at = f"{approval['expires_at']:%Y-%m-%d %H:%M:%S}"
        return FailFor(FailReason.APPROVAL_EXPIRED,
                       f"approval {approval['id']} expired at {expired_at}; the approved step "
                       f"{claim.step} is recorded as first started in time (at "
                       f"{started:%Y-%m-%d %H:%M:%S}) but recorded no answer or effect that "
                       "verifies, so nothing it did is lost and it does not begin again "
                       "after the expiry: replay or branch the run from its approval wait "
                       "to ask again", {})
    return None


def _early(claim: Claim, when: str | None, what: str) -> ParkFor | None:
    """A park when the claim came before ``when`` (ISO 8601, from the MAC'd control, by the
    database's clock, as the claim's time is), or when there is no such time at all."""
    if when is not None and claim.claimed_at >= datetime.fromisoformat(when):
        return None
    return ParkFor(ParkReason.INTEGRITY, "IntegrityViolation",
                   f"run {claim.run_id} at seq {claim.seq} was claimed for step {claim.step!r} "
                   f"at {claim.claimed_at.isoformat()}, {what}: the run was made runnable "
                   "outside onward (its row or its outbox row edited), and the step did not run")


def _recheck_timer(claim: Claim, control: TimerControl) -> ParkFor | None:
    """A timer's step runs from the time checkpoint ``seq`` signs on, never before (an
    evidence replay does not wait: it follows its source)."""
    if claim.launch.evidence:
        return None
    return _early(claim, control.until,
                  f"before {control.until}, the time checkpoint {claim.seq}'s timer runs it")


def _recheck_timeout(claim: Claim, control: SignalControl) -> ParkFor | None:
    """A signal wait's ``on_timeout`` step (when it is not also ``then``) runs only once the
    wait timed out, as checkpoint ``seq`` signs its timeout."""
    if claim.launch.evidence or claim.step != control.on_timeout or claim.step == control.then:
        return None
    return _early(claim, control.timeout_at,
                  f"but checkpoint {claim.seq}'s wait for signal {control.name!r} times out "
                  + (f"only at {control.timeout_at}" if control.timeout_at else "never"))


def _timed_out(claim: Claim, control: SignalControl) -> bool:
    """Whether the claim is a legitimate resumption at ``then`` without a signal: the wait
    names ``then`` as its ``on_timeout`` too, and its signed timeout has passed."""
    return (control.on_timeout == control.then and control.timeout_at is not None
            and claim.claimed_at >= datetime.fromisoformat(control.timeout_at))


def signal_marks(claim: Claim, waits: WaitStore) -> dict[str, int] | ParkFor:
    """The last consumed signal id per name that the checkpoint this step commits carries
    (ledger/signal_order.py): the head's, raised to the signal that resumed this step, if
    one did. A step resumed by a signal the run had consumed before (its ``consumed_seq``
    set back to NULL in the database, then taken by a later wait of the same name) parks
    ``integrity``, and so does one at the wait's ``then`` that no signal resumed (the run
    set running in the database: no signal of the name is consumed at ``seq``), unless the
    wait timed out into ``then``. One statement, only for a step resumed after a signal
    wait; an evidence replay follows its source's signals (checked by their MACs) and has
    none of its own."""
    head = claim.checkpoint
    marks = carried_marks(head.refs if head else None, claim.run_id)
    try:
        control = parse_control(head.control if head else None)
    except MalformedControl:
        return marks  # recheck parked it already
    if (not isinstance(control, SignalControl) or claim.step != control.then
            or claim.launch.evidence):
        return marks
    return _resumed_by_signal(claim, waits, control, marks)


def _resumed_by_signal(claim: Claim, waits: WaitStore, control: SignalControl,
                       marks: dict[str, int]) -> dict[str, int] | ParkFor:
    """``signal_marks`` for a step at its signal wait's ``then``: raised to the signal
    consumed at ``seq``, or parked ``integrity`` when there is none (and the wait did not
    time out into ``then``) or when the run had consumed that signal before."""
    row = waits.signal(claim.run_id, control.name, claim.seq)
    if row is None:
        if _timed_out(claim, control):
            return marks
        return ParkFor(ParkReason.INTEGRITY, "IntegrityViolation",
                       f"run {claim.run_id} at seq {claim.seq} is at step {claim.step!r}, which "
                       f"follows its wait for signal {control.name!r}, but no signal of that "
                       f"name ended the wait (none is consumed at seq {claim.seq}): the run "
                       "was made runnable outside onward, and the step did not run")
    if replayed(marks, control.name, row["id"]):
        return ParkFor(ParkReason.INTEGRITY, "IntegrityViolation",
                       f"run {claim.run_id} at seq {claim.seq} was resumed by signal "
                       f"{control.name!r} (id {row['id']}), which the run consumed before "
                       f"(its checkpoints record signal {marks[control.name]} of that name "
                       "consumed): it was made consumable again outside onward, and is not "
                       "acted on twice")
    return {**marks, control.name: int(row["id"])}
