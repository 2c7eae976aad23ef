"""An in-memory ``StepLedger`` (tasks/step_ledger.py), in the manner of dramatiq's stub
broker: the executor's decision table runs against it with no database (tests/unit).

It keeps, per run, what the real statements change (seq, step, status, lease epoch,
attempt, head checkpoint, MAC'd with the test's keys so restore verifies it as it would a
stored one) and records every statement it is asked to run, so a test reads what the
executor told the ledger. ``lose`` names statements that find the lease lost (they write
nothing and say so, as the fenced statements do). Anything that would reach PostgreSQL
(``conn``) fails the test: the unit tier touches no database.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

from ledger import signed
from ledger.checkpoints import CheckpointBody, CheckpointKeys
from ledger.effects import Effect
from ledger.exceptions import CancelRequested
from ledger.lineage import Launch
from ledger.steps import Advance, Budget, Claim, Ended, Stale, StaleReason, Successor
from ledger.vocabulary import OutcomeKind, ParkReason, RunStatus

KEYS = CheckpointKeys(current="unit", keys={"unit": b"unit-test-checkpoint-key"})


class NoDatabase:
    """Stands where a connection would: any use of it fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the unit tier touched the database (conn.{name})")


@dataclass
class StubRun:
    """One run as the stub ledger keeps it."""

    run_id: UUID
    workflow: str
    head: CheckpointBody
    head_hash: str
    max_attempts: int
    workflow_version: int | None = None
    state_schema_version: int | None = None
    step: str | None = None  # None at checkpoint 0: the start step
    seq: int = 0
    status: RunStatus = RunStatus.RUNNING
    epoch: int = 0
    attempt: int = 0
    attempts_total: int = 0
    leased: bool = False
    parent_hash: str | None = None  # the hash of checkpoint seq-1
    handbacks: int = 0
    deadline_at: datetime | None = None
    launch: Launch = field(default_factory=Launch)
    cancel_requested: dict[str, Any] | None = None
    parked_reason: ParkReason | None = None
    last_error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None


class StubLedger:
    """The statements of one claimed step, kept in memory (see the module docstring)."""

    def __init__(self, keys: CheckpointKeys = KEYS) -> None:
        self.keys = keys
        self.conn: Any = NoDatabase()
        self.runs: dict[UUID, StubRun] = {}
        self.statements: list[str] = []  # in the order the executor ran them
        self.lose: set[str] = set()  # statements that find the lease lost
        self.cancel_on: set[str] = set()  # statements that find a cancel requested
        self.commits: list[Advance] = []

    # -- what a test sets up -------------------------------------------------------------
    def start(self, workflow: str, state: dict[str, Any], *, max_attempts: int = 3,
              workflow_version: int | None = None, deadline_at: datetime | None = None,
              launch: Launch | None = None) -> UUID:
        """A run at checkpoint 0, as ``start_run`` writes it (its version unbound)."""
        run_id = uuid4()
        body = CheckpointBody(run_id=run_id, seq=0, parent_hash=None, step=None,
                              next_step=None, outcome=OutcomeKind.START.value, state=state,
                              workflow_version=None, workflow=workflow)
        launch = launch or Launch()
        launch = replace(launch, mac=self.keys.sign(launch.signed_body(run_id, "default")))
        self.runs[run_id] = StubRun(run_id, workflow, body, self.keys.mac(body.as_dict()),
                                    max_attempts, workflow_version=workflow_version,
                                    deadline_at=deadline_at, launch=launch)
        return run_id

    def edit_head(self, run_id: UUID, **changes: Any) -> None:
        """Change the head checkpoint outside onward (its MAC no longer matches)."""
        run = self.runs[run_id]
        run.head = replace(run.head, **changes)

    def _end(self, claim: Claim, status: RunStatus) -> StubRun:
        run = self.runs[claim.run_id]
        run.status, run.leased = status, False
        return run

    def _fenced(self, name: str, claim: Claim) -> bool:
        """Record the statement; False when the lease is lost (nothing is written)."""
        self.statements.append(name)
        run = self.runs[claim.run_id]
        return name not in self.lose and run.leased and run.epoch == claim.epoch

    # -- StepLedger ----------------------------------------------------------------------
    def claim(self, run_id: UUID, seq: int, owner: str, *, count_stale: bool = True,
              bind: Any = None, leases: Any = None) -> Claim | Stale:
        self.statements.append("claim")
        run = self.runs.get(run_id)
        if run is None:
            return Stale(run_id, seq, StaleReason.UNKNOWN_RUN)
        stale = (StaleReason.SEQ_MOVED if run.seq != seq
                 else StaleReason.NOT_RUNNABLE if run.status is not RunStatus.RUNNING
                 else StaleReason.LEASED if run.leased else None)
        if stale is not None:
            return Stale(run_id, seq, stale, current_seq=run.seq, status=run.status.value,
                         workflow=run.workflow, workflow_version=run.workflow_version)
        if run.workflow_version is None and bind and run.workflow in bind:
            run.workflow_version, run.state_schema_version = bind[run.workflow]
        return self._lease(run)

    def _lease(self, run: StubRun) -> Claim:
        """Take the lease of ``run`` at its seq (a claim, or a commit that claims the next)."""
        run_id = run.run_id
        run.leased = True
        run.epoch += 1
        run.attempt += 1
        run.attempts_total += 1
        now = datetime.now(UTC)
        return Claim(
            run_id=run_id, tenant_id="default", workflow=run.workflow,
            workflow_version=run.workflow_version, seq=run.seq,
            step=run.step,
            epoch=run.epoch, attempt=run.attempt, max_attempts=run.max_attempts,
            head_hash=run.head_hash, checkpoint=run.head, checkpoint_hash=run.head_hash,
            checkpoint_key_id=self.keys.current,
            budget=Budget(attempts_total=run.attempts_total, attempts=None, tokens=None,
                          cost_usd=None, deadline_at=run.deadline_at, used_tokens=0,
                          used_cost_usd=Decimal(0), run_created_at=now - timedelta(seconds=1)),
            claimed_at=now, launch=run.launch,
            state_schema_version=run.state_schema_version, handbacks=run.handbacks,
            parent_found_hash=run.parent_hash,
            head_mac=self.keys.sign(signed.head(run_id, run.seq, run.head_hash)),
            cancel_requested=run.cancel_requested)

    def heartbeat(self, claim: Claim) -> bool:
        if "heartbeat" in self.cancel_on:
            self.statements.append("heartbeat")
            raise CancelRequested(f"run {claim.run_id} is being cancelled")
        return self._fenced("heartbeat", claim)

    def commit(self, claim: Claim, advance: Advance, *,
               successor: Successor | None = None) -> bool | Claim:
        if "commit" in self.cancel_on:
            self.statements.append("commit")
            raise CancelRequested(f"run {claim.run_id} is being cancelled")
        if not self._fenced("commit", claim):
            return False
        run = self.runs[claim.run_id]
        body = CheckpointBody(
            run_id=run.run_id, seq=run.seq + 1, parent_hash=run.head_hash, step=advance.step,
            next_step=advance.next_step, outcome=advance.outcome.value, state=advance.state,
            workflow_version=advance.workflow_version,
            control=advance.wait.control.stored() if advance.wait else None,
            state_schema_version=advance.state_schema_version, refs=advance.refs,
            workflow=run.workflow)
        run.parent_hash, run.head, run.head_hash = run.head_hash, body, self.keys.mac(
            body.as_dict())
        run.seq, run.step, run.status = run.seq + 1, advance.next_step, advance.status
        run.attempt, run.max_attempts, run.leased = 0, advance.next_max_attempts, False
        run.handbacks, run.result = 0, advance.result
        self.commits.append(advance)
        due_now = advance.wait is None or advance.wait.due_at is None
        if successor is not None and advance.status is RunStatus.RUNNING and due_now:
            return self._lease(run)
        return True

    def commit_refused(self, claim: Claim) -> None:
        self.statements.append("commit_refused")
        self.runs[claim.run_id].leased = False

    def fail(self, claim: Claim, step: str, error: dict[str, Any], *,
             retry_in_s: float | None) -> bool:
        if not self._fenced("fail", claim):
            return False
        run = self._end(claim, RunStatus.RUNNING)
        run.last_error = error
        return True

    def fail_run(self, claim: Claim, step: str, error: dict[str, Any]) -> Ended:
        if not self._fenced("fail_run", claim):
            return Ended.LOST
        self._end(claim, RunStatus.FAILED).last_error = error
        return Ended.ENDED

    def end_cancelled(self, claim: Claim, step: str | None) -> Ended:
        if not self._fenced("end_cancelled", claim):
            return Ended.LOST
        self._end(claim, RunStatus.CANCELLED)
        return Ended.ENDED

    def park(self, claim: Claim, step: str | None, reason: ParkReason,
             error: dict[str, Any]) -> bool:
        if not self._fenced("park", claim):
            return False
        run = self._end(claim, RunStatus.NEEDS_REVIEW)
        run.parked_reason, run.last_error = reason, error
        return True

    def release(self, claim: Claim, error: dict[str, Any], *,
                resend_in_s: float | None = None, spend_attempt: bool = False) -> bool:
        if not self._fenced("release", claim):
            return False
        self._end(claim, RunStatus.RUNNING).last_error = error
        return True

    def hand_back(self, claim: Claim, error: dict[str, Any], *, delay_s: float,
                  park: bool, unbind: bool = False,
                  bind_to: tuple[int, int] | None = None) -> bool:
        if not self._fenced("hand_back", claim):
            return False
        run = self._end(claim, RunStatus.NEEDS_REVIEW if park else RunStatus.RUNNING)
        if unbind:
            run.workflow_version, run.state_schema_version = bind_to or (None, None)
        run.handbacks, run.last_error = run.handbacks + 1, error
        run.attempt -= 1  # a hand-back spends no attempt
        if park:
            run.parked_reason = ParkReason.NO_WORKER_FOR_VERSION
        return True

    def defer(self, claim: Claim, step: str, *, delay_s: float, waiting_on: str,
              detail: str) -> bool:
        if not self._fenced("defer", claim):
            return False
        self._end(claim, RunStatus.RUNNING)
        return True

    def diverge(self, claim: Claim, step: str, report: dict[str, Any]) -> bool:
        if not self._fenced("diverge", claim):
            return False
        self._end(claim, RunStatus.DIVERGED).last_error = report
        return True


class StubEffects:
    """The effect store as the executor's run-ending paths read it: the run's effects
    whose outcome is unknown (``unresolved``). Nothing else is kept."""

    def __init__(self) -> None:
        self.conn: Any = NoDatabase()
        self.keys = KEYS  # no encryption keys: nothing is sealed
        self.unknown: list[Effect] = []

    def unresolved(self, run_id: UUID) -> list[Effect]:
        return [e for e in self.unknown if e.run_id == run_id]


class StubEvidence:
    """The evidence store: a step that makes no model call or read never asks it."""

    def __init__(self) -> None:
        self.conn: Any = NoDatabase()
