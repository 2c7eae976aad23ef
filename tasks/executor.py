"""Execute one step: claim, restore, run, commit, publish (docs/design.md sections 4 and 7).

``execute_step`` is plain Python; the Celery task in ``workers/`` is a thin shell around it
and tests call it directly.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any
from uuid import UUID

import structlog
from pydantic import BaseModel, Field, StrictInt

from ledger.checkpoints import CheckpointKeys
from ledger.crypto import REQUEST_FIELD, Place, sealed_text
from ledger.effects import Effect, EffectStore
from ledger.evidence import EvidenceStore
from ledger.exceptions import (
    CancelRequested,
    EffectFenced,
    EvidenceFenced,
    InvalidInput,
    SealedValueUnreadable,
    StatementRefused,
)
from ledger.signal_order import MARKS_KEY, marks_ref
from ledger.steps import Advance, Claim, Ended, Stale, Successor, error_record
from ledger.vocabulary import ParkReason, RunStatus
from ledger.waits import WaitStore
from tasks import credentials, faults, observe
from tasks.advance import next_checkpoint
from tasks.body import run_step_body
from tasks.clock import StepClock
from tasks.context import StepContext
from tasks.control import CancelFor, DivergeFor, FailFor, ParkFor, Suspend, WaitFor
from tasks.exceptions import EffectOutcomeUnknown, LeaseLost, OutcomeError, StepError
from tasks.policy import Limits, recheck, signal_marks
from tasks.resolve import Resolver
from tasks.restore import Refusal, Restored, restore
from tasks.routing import version_queue
from tasks.sensitive import seal_error, seal_state, sensitive_fields
from tasks.services import StepServices
from tasks.step_ledger import StepLedger
from tasks.workflow import Registry, Step

__all__ = [
    "ExecutorConfig",
    "ReportKind",
    "StepMessage",
    "StepReport",
    "execute_step",
    "retry_delay",
]


log = structlog.get_logger("onward.executor")


MAX_SEQ = 2**31 - 1
"""The largest seq a checkpoint can have (``onward.checkpoints.seq`` is an ``integer``)."""


class StepMessage(BaseModel):
    """The whole Celery message: "execute the step that follows checkpoint ``seq``"."""

    model_config = {"extra": "forbid", "frozen": True}

    run_id: UUID
    # a JSON integer, as the outbox sends it: not "0", true or 1.0 taken for one, nor a seq
    # no checkpoint can have (seq is a PostgreSQL integer)
    seq: StrictInt = Field(ge=0, le=MAX_SEQ)


class ReportKind(StrEnum):
    STALE = "stale"
    COMMITTED = "committed"
    RETRY = "retry"
    FAILED = "failed"
    PARKED = "parked"
    WAITING = "waiting"
    RELEASED = "released"
    LEASE_LOST = "lease_lost"
    DIVERGED = "diverged"  # an evidence replay met a call its parent never made
    CANCELLED = "cancelled"  # an operator's cancel request was honoured


@dataclass(frozen=True)
class StepReport:
    kind: ReportKind
    run_id: UUID
    seq: int
    next_seq: int | None = None  # set when a message for the next step must be published
    detail: str = ""
    queue: str | None = None  # where that message goes (the run's version queue)
    # For monitoring (metrics, Flower names): the run's workflow and the version that ran,
    # and the step the next message runs (set by a commit that sends one).
    workflow: str | None = None
    version: int | None = None
    next_step: str | None = None
    status: str | None = None  # the run's status after a commit (running, waiting, completed…)
    priority: str | None = None  # the run's priority: its next message's broker priority
    # the next step, already claimed for this worker by the commit (``chain``): run it with
    # ``execute_step(..., claimed=next_claim)``; no message is published for it
    next_claim: Claim | None = None


@dataclass(frozen=True)
class ExecutorConfig:
    keys: CheckpointKeys
    max_state_bytes: int
    retry_base_s: float
    retry_max_s: float
    max_artifact_bytes: int = 10_000_000
    queue: str = "onward.steps"  # the base queue; version queues hang off it
    handback_limit: int = 10  # hand-backs in a row before the run parks no_worker_for_version
    handback_max_delay_s: float = 30.0  # cap of the hand-back backoff (1 s, 2 s, 4 s, ...)
    max_json_depth: int = 64  # settings.max_json_depth
    max_effect_payload_bytes: int = 1_000_000
    max_approval_artifact_bytes: int = 1_000_000
    tool_timeout_s: float = 30.0  # a provider call's time limit when its tool sets none
    tool_lease_margin_s: float = 5.0  # lease kept beyond that limit to record the answer
    model_timeout_s: float = 120.0  # a model call's time limit when its client sets none


def retry_delay(attempt: int, base_s: float, max_s: float) -> float:
    """Exponential backoff with jitter: base * 2^(attempt-1), capped, in [50%, 100%]."""
    ceiling = min(max_s, base_s * (2.0 ** min(max(0, attempt - 1), 1000)))
    return ceiling * (0.5 + random.random() / 2)


def execute_step(
    store: StepLedger,
    registry: Registry,
    config: ExecutorConfig,
    message: StepMessage,
    *,
    worker: str,
    publish: Callable[[UUID, int, str], None],
    effects: EffectStore | None = None,
    evidence: EvidenceStore | None = None,
    count_stale: bool = True,
    chain: Callable[[], bool] | None = None,
    claimed: Claim | None = None,
) -> StepReport:
    """Run the step after checkpoint ``message.seq`` of ``message.run_id`` at most to one commit.

    ``count_stale=False`` is for a claim no message asked for (eager continuation): if it
    finds the run elsewhere, that is not a stale delivery and is not counted as one.

    ``chain`` (eager continuation), asked just before the commit: True lets the commit claim
    the run's next step for this worker in the same statement (``StepStore.commit``); the
    report then carries that claim as ``next_claim`` and nothing is published. ``claimed``
    runs such a claim: the step is not claimed again.
    """
    effects = effects or EffectStore(store.conn, config.keys)
    evidence = evidence or EvidenceStore(store.conn, max_artifact_bytes=config.max_artifact_bytes,
                                         keys=config.keys,
                                         max_json_depth=config.max_json_depth)
    taken = claimed or _claim(store, registry, config, message, worker, count_stale)
    if isinstance(taken, StepReport):
        return taken
    claimed = taken
    faults.point("after_claim", claimed.step)
    observe.claimed(claimed)
    successor = None
    if chain is not None:
        leases = registry.step_leases(config.tool_lease_margin_s)
        successor = lambda: Successor(worker, leases) if chain() else None  # noqa: E731
    attempt = _Attempt(store, registry, config, claimed, worker, effects, evidence,
                       log.bind(run_id=str(claimed.run_id), seq=claimed.seq,
                                attempt=claimed.attempt), successor)
    report = replace(attempt.run(), priority=claimed.priority.value)
    if report.workflow is None:
        report = replace(report, workflow=claimed.workflow, version=claimed.workflow_version)
    if report.next_seq is not None and report.next_claim is None:
        faults.point("after_commit_before_publish", claimed.step)
        publish(report.run_id, report.next_seq, report.queue or config.queue)
    return report


def _claim(store: StepLedger, registry: Registry, config: ExecutorConfig,
           message: StepMessage, worker: str, count_stale: bool) -> Claim | StepReport:
    """The claim statement (docs/design.md section 4.1), or the stale report it comes to."""
    claimed = store.claim(message.run_id, message.seq, worker, count_stale=count_stale,
                          bind=registry.first_claim_versions(),
                          leases=registry.step_leases(config.tool_lease_margin_s))
    if isinstance(claimed, Stale):
        log.info("stale delivery" if count_stale else "run moved on before eager continuation",
                 run_id=str(claimed.run_id), seq=claimed.seq,
                 reason=claimed.reason.value, current_seq=claimed.current_seq)
        return StepReport(ReportKind.STALE, message.run_id, message.seq, detail=claimed.reason,
                          workflow=claimed.workflow, version=claimed.workflow_version)
    return claimed


@dataclass(frozen=True)
class _Ready:
    """A restored step about to run: its code and state, the run's limits, the services
    its body calls through, and how the run ends if it must."""

    restored: Restored
    limits: Limits
    services: StepServices
    ending: _Ending
    started: float = field(default_factory=time.perf_counter)
    signal_marks: dict[str, int] = field(default_factory=dict)  # ledger/signal_order.py

    @property
    def step(self) -> Step:
        return self.restored.step


@dataclass(frozen=True)
class _Body:
    """What the step's code came to: the outcome it returned, or the error it raised
    (neither when it was suspended: the decision is on ``services.control``)."""

    outcome: object = None
    error: Exception | None = None


@dataclass(frozen=True)
class _Attempt:
    """One claimed execution of one step, in four phases (docs/design.md section 7):
    restore or refuse, run the body, settle the decision, commit and continue. Each phase
    returns what the next one needs, or the ``StepReport`` the attempt ends with."""

    store: StepLedger
    registry: Registry
    config: ExecutorConfig
    claim: Claim
    worker: str
    effects: EffectStore
    evidence: EvidenceStore
    log: Any
    successor: Callable[[], Successor | None] | None = None  # see execute_step's ``chain``

    def run(self) -> StepReport:
        request = self.claim.cancel_requested
        if request is not None:  # an operator asked: end it, run nothing
            ending = self._ending(self.claim.step)
            return ending.cancel(str(request.get("message", "cancel requested")))
        ready = self.restore_or_refuse()
        if isinstance(ready, StepReport):
            return ready
        body = self.run_body(ready)
        if isinstance(body, StepReport):
            return body
        advance = self.settle(ready, body)
        if isinstance(advance, StepReport):
            return advance
        return self.commit_and_continue(ready, advance)

    # -- phase 1: restore or refuse ----------------------------------------------------------
    def restore_or_refuse(self) -> _Ready | StepReport:
        """Restore the checkpoint and re-check the run's limits; what may not run is handed
        back, released, parked or failed here, before any step code runs."""
        restored = restore(self.config.keys, self.registry, self.claim)
        if isinstance(restored, Refusal):
            return self._refuse(restored)
        limits = Limits.of(self.claim.budget, restored.workflow.budgets)
        waits = WaitStore(self.effects.conn)
        refused = recheck(self.claim, limits, waits, self.config.keys)
        marks = signal_marks(self.claim, waits) if refused is None else None
        if isinstance(marks, ParkFor):
            refused, marks = marks, None
        if refused is not None:
            return self._ending(restored.step.name).refuse(refused)
        services = self._services(restored, limits)
        return _Ready(restored, limits, services, self._ending(restored.step.name, services),
                      signal_marks=marks or {})

    def _sealed_error(self, error: dict[str, Any]) -> dict[str, Any]:
        """An error onward writes into the run's row and the attempt's, its message sealed
        as a step error's is, with keys (a refusal may quote the state: a validation error,
        a migration's exception)."""
        claim = self.claim
        return seal_error(self.config.keys.crypt, error,
                          tenant=claim.tenant_id, run_id=claim.run_id, seq=claim.seq)

    def _refuse(self, refusal: Refusal) -> StepReport:
        if refusal.hand_back:
            return self._hand_back(refusal)
        claim = self.claim
        error = self._sealed_error(error_record(refusal.error_type, refusal.message))
        self.log.error("run parked for review", reason=refusal.reason, detail=refusal.message)
        self.store.park(claim, claim.step, refusal.reason, error)
        return self._report(ReportKind.PARKED, refusal.message)

    def _hand_back(self, refusal: Refusal) -> StepReport:
        """This worker lacks the run's workflow, or the version it is bound to: give the
        step back to the fleet without spending an attempt, backing off, for a worker that
        has it; after ``handback_limit`` hand-backs in a row (no such worker took it
        meanwhile: a commit resets the count), park it ``no_worker_for_version``. A
        deploy that stops the workflow's workers for a while therefore parks none of its
        runs, whichever other workers claim them meanwhile."""
        claim, config = self.claim, self.config
        handbacks = claim.handbacks + 1
        park = handbacks >= config.handback_limit
        delay = min(config.handback_max_delay_s, 2.0 ** min(handbacks - 1, 30))
        message = refusal.message
        if park:
            message = _no_worker_message(claim, handbacks, refusal)
        error = self._sealed_error(error_record(
            "NoWorkerForVersion" if park else refusal.error_type, message,
            handbacks=handbacks, workflow_version=claim.workflow_version))
        if not self.store.hand_back(claim, error, delay_s=delay, park=park,
                                    unbind=refusal.unbind, bind_to=refusal.bind_to):
            return self._report(ReportKind.LEASE_LOST)
        if park:
            self.log.error("run parked for review", reason=ParkReason.NO_WORKER_FOR_VERSION,
                           detail=message)
            return self._report(ReportKind.PARKED, message)
        self.log.warning("step handed back for a worker with the run's code", detail=message,
                         reason=refusal.reason, handbacks=handbacks, resend_in_s=delay)
        return self._report(ReportKind.RELEASED, message)

    def _services(self, restored: Restored, limits: Limits) -> StepServices:
        claim, config = self.claim, self.config
        return StepServices(
            effects=self.effects, evidence=self.evidence, run_id=claim.run_id,
            tenant_id=claim.tenant_id, seq=claim.seq, step=restored.step.name,
            epoch=claim.epoch, worker=self.worker, llm_client=restored.workflow.llm,
            control=claim.checkpoint.control if claim.checkpoint else None,
            tokens_left=limits.tokens_left(claim.budget),
            cost_left_usd=limits.cost_left(claim.budget), spent=claim.budget.spent(),
            launch=claim.launch, clock=StepClock(claim.claimed_at),
            max_effect_payload_bytes=config.max_effect_payload_bytes,
            max_json_depth=config.max_json_depth,
            tool_timeout_s=config.tool_timeout_s, lease_margin_s=config.tool_lease_margin_s,
            model_timeout_s=config.model_timeout_s, priority=claim.priority,
            claim_covers_until=claim.lease_until if claim.answered is False else None,
        )

    # -- phase 2: run the body ---------------------------------------------------------------
    def run_body(self, ready: _Ready) -> _Body | StepReport:
        """Run the step's code once (plain or async, held to its timeout: tasks/body.py). A
        lease lost while it ran ends the attempt (what it did is discarded); any other
        error is the body's (``StepTimedOut`` included), for ``settle`` to weigh."""
        step, services = ready.step, ready.services
        ctx = StepContext(
            run_id=self.claim.run_id, seq=self.claim.seq, attempt=self.claim.attempt,
            step=step.name, workflow=ready.restored.workflow, worker=self.worker,
            tenant_id=self.claim.tenant_id, services=services,
            _heartbeat=lambda: self._heartbeat(services),
        )
        try:
            faults.point("in_step", step.name)
            return _Body(outcome=run_step_body(step, ctx, ready.restored.state))
        except Suspend:
            return _Body()  # the decision is on services.control
        except (LeaseLost, EffectFenced, EvidenceFenced) as exc:
            self.log.warning("lease lost during step; result discarded", error=str(exc))
            self.store.commit_refused(self.claim)
            return self._report(ReportKind.LEASE_LOST)
        except Exception as exc:
            return _Body(error=exc)

    def _heartbeat(self, services: StepServices) -> bool:
        try:
            return self.store.heartbeat(self.claim)
        except CancelRequested as exc:
            raise services.cancelled(exc) from exc

    # -- phase 3: settle the decision --------------------------------------------------------
    def settle(self, ready: _Ready, body: _Body) -> Advance | StepReport:
        """What the attempt comes to. A wait, a park, a budget stop, a divergence or a
        cancel decided inside the step stands, whatever the body caught or returned; then an
        error retries or fails the step; else its outcome becomes the next checkpoint."""
        services = ready.services
        error = body.error
        if error is None and services.unknown:
            # the body caught an unknown outcome and went on: the step must not commit past it
            error = EffectOutcomeUnknown(
                f"step {ready.step.name} went on after the outcome of effect "
                f"{next(iter(services.unknown.values()))} became unknown; the next attempt "
                "reconciles it")
        decided = self._decided(ready)
        if decided is not None:
            return decided
        if error is not None:
            return self._retry_or_fail(ready, error)
        try:
            advance = self._advance(ready, body.outcome)
        except OutcomeError as exc:
            return self._retry_or_fail(ready, exc)
        replayed = services.replay_wait(advance)  # evidence replays follow recorded decisions
        if replayed is None:  # diverged, or the recorded decision does not verify (parked)
            decided = self._decided(ready)
            if decided is not None:
                return decided
        return replayed or advance

    def _decided(self, ready: _Ready) -> StepReport | None:
        """End the attempt as the step's own decision says, if it took one."""
        decision = ready.services.control.decision
        if isinstance(decision, CancelFor):
            return ready.ending.cancel(decision.message)
        if isinstance(decision, DivergeFor):
            return self._diverge(ready.step.name, decision)
        if isinstance(decision, (ParkFor, FailFor)):
            return ready.ending.refuse(decision)
        if isinstance(decision, WaitFor):
            return self._defer(ready.step.name, decision)
        return None

    def _defer(self, step: str, wait: WaitFor) -> StepReport:
        if not self.store.defer(self.claim, step, delay_s=wait.delay_s,
                                waiting_on=wait.waiting_on, detail=wait.detail):
            return self._report(ReportKind.LEASE_LOST)
        self.log.info("step waiting", waiting_on=wait.waiting_on, delay_s=wait.delay_s)
        return self._report(ReportKind.WAITING, wait.detail)

    def _diverge(self, step: str, decision: DivergeFor) -> StepReport:
        """Stop an evidence replay that diverged from its parent, with the report on the run;
        the request it quotes (a prompt, an effect's payload) sealed, as those are, with keys."""
        claim, report = self.claim, decision.report
        if report.get("request") is not None:
            report = {**report, "request": sealed_text(self.config.keys.crypt, report["request"],
                                                       Place(claim.tenant_id, claim.run_id,
                                                             claim.seq, REQUEST_FIELD))}
        if not self.store.diverge(claim, step, report):
            return self._report(ReportKind.LEASE_LOST)
        self.log.error("replay diverged", detail=decision.message)
        return self._report(ReportKind.DIVERGED, decision.message)

    def _advance(self, ready: _Ready, outcome: object) -> Advance:
        """The checkpoint the outcome commits, with what it binds under its MAC."""
        migrated = ready.restored.migrated
        advance = next_checkpoint(outcome, ready.restored, limits=ready.limits,
                                  sizes=self.config, now=ready.services.clock.now())
        refs = ready.services.refs(self.claim.budget.spent())
        if migrated is not None:
            refs["migrated_from"] = migrated.as_ref()
        consumed = marks_ref(self.claim.run_id, ready.signal_marks)
        if consumed is not None:  # the signals the run consumed, carried (ledger/signal_order.py)
            refs[MARKS_KEY] = consumed
        return replace(advance, refs=refs, state=self._sealed(ready.restored, advance.state))

    def _sealed(self, restored: Restored, state: dict[str, Any]) -> dict[str, Any]:
        """The state with its sensitive fields sealed (tasks/sensitive.py)."""
        claim = self.claim
        return seal_state(self.config.keys.crypt, state,
                          sensitive_fields(restored.workflow.state), tenant=claim.tenant_id,
                          run_id=claim.run_id, seq=claim.seq + 1, parent_stored=claim.state,
                          parent_plain=restored.opened, foreign=restored.foreign)

    def _retry_or_fail(self, ready: _Ready, exc: Exception) -> StepReport:
        """A step error: retry the step later, or fail the run when the error says it is
        final or the step's attempts are spent. Its message is recorded sealed with keys,
        whatever the workflow (tasks/sensitive.py ``seal_error``)."""
        claim, ending = self.claim, ready.ending
        non_retryable = isinstance(exc, StepError) and exc.non_retryable
        exhausted = claim.attempt >= claim.max_attempts
        message = credentials.redact(str(exc))  # recorded: no resolved credential in it
        error = seal_error(self.config.keys.crypt, error_record(
            type(exc).__name__, message, step=ending.step, attempt=claim.attempt,
            max_attempts=claim.max_attempts),
            tenant=claim.tenant_id, run_id=claim.run_id, seq=claim.seq)
        if non_retryable or exhausted:
            self.log.error("step failed; run fails", step=ending.step, error=message,
                           non_retryable=non_retryable)
            # what a park for an unresolved effect records: not the message if it is sealed
            shown = message if error["message"] is message else f"{type(exc).__name__}: ***"
            return ending.fail(error, shown)
        retry_in = retry_delay(claim.attempt, self.config.retry_base_s, self.config.retry_max_s)
        if not self.store.fail(claim, ending.step or "", error, retry_in_s=retry_in):
            return self._report(ReportKind.LEASE_LOST)
        self.log.warning("step failed; retrying", step=ending.step, error=str(exc),
                         retry_in_s=round(retry_in, 3))
        return self._report(ReportKind.RETRY, str(exc))

    # -- phase 4: commit and continue --------------------------------------------------------
    def commit_and_continue(self, ready: _Ready, advance: Advance) -> StepReport:
        """The one commit statement; then say whether a message for the next step goes out."""
        step = ready.step.name
        # a retry, or a step that ran before without spending an attempt (deferred, continued)
        # and left an effect unsettled: what an earlier execution left is resolved first
        if self.claim.attempt > 1 or self.claim.effects_open:
            refused = self._resolve_left(ready)
            if refused is not None:
                return refused
        faults.point("before_checkpoint_commit", step)
        successor = self.successor() if self.successor is not None else None
        try:
            committed = self.store.commit(self.claim, advance, successor=successor)
        except CancelRequested as exc:
            return ready.ending.cancel(str(exc))
        except (StatementRefused, InvalidInput) as exc:  # nothing written: a step failure
            failure = OutcomeError(f"the ledger refused to commit step {step}: {exc}")
            return self._retry_or_fail(ready, failure)
        if not committed:
            self.log.warning("lease lost before commit; result discarded", step=step)
            return self._report(ReportKind.LEASE_LOST)
        faults.point("after_checkpoint_commit", step)
        self.log.debug("step committed", step=step, next_step=advance.next_step,
                       ms=round((time.perf_counter() - ready.started) * 1000, 2))
        report = self._continue(ready, advance)
        if isinstance(committed, Claim):  # the commit claimed the next step for this worker
            faults.point("after_chained_commit", step)
            report = replace(report, next_claim=committed)
        return report

    def _resolve_left(self, ready: _Ready) -> StepReport | None:
        """A retry never commits past an effect an earlier attempt left with an unknown
        outcome (its worker died after the provider acted) that this attempt did not call
        again (its body took another path); nor does a re-run claimed as attempt 1 whose
        claim found an effect of its seq unsettled (``effects_open``: the step deferred, to
        poll an accepted job say, or was continued after a park, and neither spends an
        attempt). As failing does (docs/effects.md, "When a run
        ends: resolve first"), the run's effects of unknown outcome are looked up first:
        found, recorded ``completed`` (reconciled); missing, the call never landed and the
        step's never-landed effects are closed ``unsent``; still unknown, the run parks
        ``effect_outcome_unknown`` naming it. None: the step may commit. A retry pays one
        read (and what it finds costs a lookup each); a first attempt pays nothing: every
        effect it made it settled itself, or it would not be committing (``settle``), and
        its claim statement said no earlier execution left one unsettled."""
        ending = ready.ending
        unknown = ending.unresolved()
        if isinstance(unknown, StepReport):
            return unknown
        if unknown is not None:
            return ending.park_unknown(unknown, f"step {ready.step.name} was to commit "
                                                "without the call an earlier attempt made")
        # fenced on the lease: if it was lost, nothing is closed and the commit says so
        closed = self.effects.close_unsent(self.claim.run_id, self.claim.seq,
                                           epoch=self.claim.epoch)
        if closed:
            self.log.warning("effects an earlier attempt left never landed; closed unsent",
                             step=ready.step.name, closed=closed)
        return None

    def _continue(self, ready: _Ready, advance: Advance) -> StepReport:
        workflow, migrated = ready.restored.workflow, ready.restored.migrated
        if migrated is not None:
            self.log.warning("run migrated to newer code", workflow=workflow.name,
                             from_version=migrated.workflow_version,
                             to_version=workflow.version,
                             from_schema=migrated.state_schema_version,
                             to_schema=workflow.state_schema_version)
        wait = advance.wait
        fast_path = advance.status is RunStatus.RUNNING and (wait is None or wait.due_at is None)
        return StepReport(ReportKind.COMMITTED, self.claim.run_id, self.claim.seq,
                          next_seq=self.claim.seq + 1 if fast_path else None,
                          queue=version_queue(self.config.queue, workflow.name, workflow.version),
                          workflow=workflow.name, version=workflow.version,
                          next_step=advance.next_step, status=advance.status.value)

    # -- shared ------------------------------------------------------------------------------
    def _report(self, kind: ReportKind, detail: str = "") -> StepReport:
        return StepReport(kind, self.claim.run_id, self.claim.seq, detail=detail)

    def _ending(self, step: str | None, services: StepServices | None = None) -> _Ending:
        """How the run ends from here; its unknown effects are resolved with the tools this
        step used, else those of the workflow modules."""
        used = services.tools_used if services is not None else {}
        registry, config = self.registry, self.config
        resolver = Resolver(self.effects, lambda name: used.get(name) or registry.tool(name),
                            self.worker, self.claim.epoch, config.tool_timeout_s,
                            config.tool_lease_margin_s, simulation=self.claim.launch.simulation)
        return _Ending(self.store, resolver, self.claim, step, self.log, self._sealed_error)


def _no_worker_message(claim: Claim, handbacks: int, refusal: Refusal) -> str:
    """Why a run handed back ``handbacks`` times is parked, and what to do: the workflow
    (and the version, for a run bound to one) that no worker which claimed it had, or (a
    new run whose input no claiming worker's model accepted) a version that accepts it."""
    last = refusal.message
    if refusal.unbind:
        return (f"no worker whose version of {claim.workflow} accepts the run's input took "
                f"the run: it was handed back {handbacks} times in a row (last: {last}); "
                f"deploy workers of the version of {claim.workflow} the run was started for "
                f"(its state model must accept the input), then `onward runs continue "
                f"{claim.run_id}`; if no version should accept it, `onward runs cancel "
                f"{claim.run_id}`")
    wanted = (f"{claim.workflow} v{claim.workflow_version}"
              if claim.workflow_version is not None else f"workflow {claim.workflow}")
    return (f"no worker with {wanted} took the run: it was handed back {handbacks} times "
            f"in a row by workers without it (last: {last}); deploy workers whose "
            f"ONWARD_WORKFLOWS includes the module defining {wanted}, then `onward runs "
            f"continue {claim.run_id}`")


@dataclass(frozen=True)
class _Ending:
    """Every way a claimed step ends the run (fail, refuse, cancel) or parks it: effects
    whose outcome is unknown are resolved first, and what stays unknown parks the run."""

    store: StepLedger
    resolver: Resolver
    claim: Claim
    step: str | None
    log: Any
    sealed: Callable[[dict[str, Any]], dict[str, Any]]  # _Attempt._sealed_error

    def _report(self, kind: ReportKind, detail: str = "") -> StepReport:
        return StepReport(kind, self.claim.run_id, self.claim.seq, detail=detail)

    def refuse(self, refusal: FailFor | ParkFor) -> StepReport:
        """Park the run, or fail it for good with a reason (budgets, deadlines, approvals)."""
        if isinstance(refusal, ParkFor):
            return self.park(refusal.reason, refusal.error_type, refusal.message)
        error = self.sealed(error_record(refusal.reason, refusal.message,
                                         reason=refusal.reason, spent=refusal.spent,
                                         step=self.step))
        return self.fail(error, refusal.message)

    def park(self, reason: ParkReason, error_type: str, message: str,
             **fields: Any) -> StepReport:
        self.log.error("run parked for review", reason=reason, detail=message, **fields)
        if not self.store.park(self.claim, self.step, reason,
                               self.sealed(error_record(error_type, message))):
            return self._report(ReportKind.LEASE_LOST)
        return self._report(ReportKind.PARKED, message)

    def unresolved(self) -> Effect | StepReport | None:
        """Resolve the run's effects of unknown outcome: the first that stays unknown, a
        report if the lease was lost or the run parked, or None (none is left)."""
        try:
            return self.resolver.first_unknown(self.claim.run_id)
        except EffectFenced as exc:
            self.log.warning("lease lost while resolving effects", error=str(exc))
            self.store.commit_refused(self.claim)
            return self._report(ReportKind.LEASE_LOST)
        except SealedValueUnreadable as exc:  # e.g. its tenant's data keys were erased
            return self.park_unknown(None, f"its effects' sealed values cannot be opened "
                                            f"to settle them ({exc})")

    def park_unknown(self, effect: Effect | None, why: str) -> StepReport:
        named = (f"effect {effect.effect_type} {effect.effect_id[:16]}… ({effect.status.value})"
                 if effect is not None else "an effect")
        return self.park(ParkReason.EFFECT_OUTCOME_UNKNOWN, "EffectOutcomeUnknown",
                         f"{why}; {named} may have reached the provider and its outcome is "
                         "unknown: a person checks the provider before anything else",
                         effect_id=effect.effect_id if effect is not None else None)

    def fail(self, error: dict[str, Any], detail: str) -> StepReport:
        """Fail the run for good, its never-sent effects closed in the same statement."""
        unknown = self.unresolved()
        if isinstance(unknown, StepReport):
            return unknown
        if unknown is None:
            ended = self.store.fail_run(self.claim, self.step or "", error)
            if ended is Ended.LOST:
                return self._report(ReportKind.LEASE_LOST)
            if ended is Ended.ENDED:
                self.log.error("run stopped", reason=error.get("reason"), detail=detail)
                return self._report(ReportKind.FAILED, detail)
        return self.park_unknown(unknown, f"the run was to fail ({detail})")

    def cancel(self, message: str) -> StepReport:
        """Honour an operator's cancel request once no effect's outcome is unknown."""
        unknown = self.unresolved()
        if isinstance(unknown, StepReport):
            return unknown
        if unknown is None:
            ended = self.store.end_cancelled(self.claim, self.step)
            if ended is Ended.LOST:
                return self._report(ReportKind.LEASE_LOST)
            if ended is Ended.ENDED:
                self.log.warning("run cancelled", detail=message)
                return self._report(ReportKind.CANCELLED, message)
        return self.park_unknown(unknown, f"the run was to be cancelled ({message}); "
                                           "cancel it again once the provider was checked")
