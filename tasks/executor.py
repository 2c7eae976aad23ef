"""Execute one step: claim, restore, run, commit, publish (docs/design.md sections 4 and 7).

``execute_step`` is plain Python; the Celery task in ``workers/`` is a thin shell around it
and tests call it directly.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

import structlog
from pydantic import BaseModel, ValidationError

from ledger.checkpoints import CheckpointKeys, canonical_json
from ledger.effects import Effect, EffectStore
from ledger.evidence import EvidenceStore
from ledger.exceptions import (
    CancelRequested,
    EffectFenced,
    EvidenceFenced,
    InvalidInput,
    StatementRefused,
)
from ledger.steps import Advance, Claim, Ended, Stale, StepStore, error_record
from ledger.vocabulary import OutcomeKind, ParkReason, RunStatus
from ledger.waits import WaitStore
from tasks import faults, observe
from tasks.clock import StepClock
from tasks.context import StepContext
from tasks.control import CancelFor, DivergeFor, FailFor, ParkFor, Suspend, WaitFor
from tasks.exceptions import EffectOutcomeUnknown, LeaseLost, OutcomeError, StepError
from tasks.outcomes import AskApproval, Fail, Finish, Goto, Sleep, WaitSignal
from tasks.policy import Limits, recheck
from tasks.resolve import Resolver
from tasks.restore import Refusal, restore
from tasks.routing import version_queue
from tasks.services import StepServices
from tasks.waiting import build_wait
from tasks.workflow import Registry, Step, Workflow

log = structlog.get_logger("onward.executor")


class StepMessage(BaseModel):
    """The whole Celery message: "execute the step that follows checkpoint ``seq``"."""

    model_config = {"extra": "forbid", "frozen": True}

    run_id: UUID
    seq: int


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
    store: StepStore,
    registry: Registry,
    config: ExecutorConfig,
    message: StepMessage,
    *,
    worker: str,
    publish: Callable[[UUID, int, str], None],
    effects: EffectStore | None = None,
    evidence: EvidenceStore | None = None,
    count_stale: bool = True,
) -> StepReport:
    """Run the step after checkpoint ``message.seq`` of ``message.run_id`` at most to one commit.

    ``count_stale=False`` is for a claim no message asked for (eager continuation): if it
    finds the run elsewhere, that is not a stale delivery and is not counted as one.
    """
    effects = effects or EffectStore(store.conn, config.keys)
    evidence = evidence or EvidenceStore(store.conn, max_artifact_bytes=config.max_artifact_bytes,
                                         keys=config.keys,
                                         max_json_depth=config.max_json_depth)
    claimed = store.claim(message.run_id, message.seq, worker, count_stale=count_stale,
                          bind=registry.first_claim_versions())
    if isinstance(claimed, Stale):
        log.info("stale delivery" if count_stale else "run moved on before eager continuation",
                 run_id=str(claimed.run_id), seq=claimed.seq,
                 reason=claimed.reason.value, current_seq=claimed.current_seq)
        return StepReport(ReportKind.STALE, message.run_id, message.seq, detail=claimed.reason,
                          workflow=claimed.workflow, version=claimed.workflow_version)
    faults.point("after_claim", claimed.step)
    observe.claimed(claimed)
    if claimed.cancel_requested is not None:  # an operator asked: end it, run nothing
        ending = _Ending(store, _resolver(config, registry, claimed, worker, effects, None),
                         claimed, claimed.step, log.bind(run_id=str(claimed.run_id)))
        return ending.cancel(str(claimed.cancel_requested.get("message", "cancel requested")))
    report = _run_claimed(store, registry, config, claimed, worker, effects, evidence)
    if report.workflow is None:
        report = replace(report, workflow=claimed.workflow, version=claimed.workflow_version)
    if report.next_seq is not None:
        faults.point("after_commit_before_publish", claimed.step)
        publish(report.run_id, report.next_seq, report.queue or config.queue)
    return report


def _run_claimed(
    store: StepStore, registry: Registry, config: ExecutorConfig, claim: Claim, worker: str,
    effects: EffectStore, evidence: EvidenceStore,
) -> StepReport:
    bound = log.bind(run_id=str(claim.run_id), seq=claim.seq, attempt=claim.attempt)
    restored = restore(config.keys, registry, claim)
    if isinstance(restored, Refusal):
        refusal = error_record(restored.error_type, restored.message)
        if restored.resend:
            return _hand_back(store, config, claim, restored, bound)
        if not restored.park:
            bound.error("message handed back, run left unchanged", reason=restored.reason,
                        detail=restored.message)
            store.release(claim, refusal, spend_attempt=True)
            return StepReport(ReportKind.RELEASED, claim.run_id, claim.seq,
                              detail=restored.message)
        bound.error("run parked for review", reason=restored.reason, detail=restored.message)
        store.park(claim, claim.step, restored.reason, refusal)
        return StepReport(ReportKind.PARKED, claim.run_id, claim.seq, detail=restored.message)
    workflow, step, state = restored.workflow, restored.step, restored.state
    limits = Limits.of(claim.budget, workflow.budgets)
    refused = recheck(claim, limits, WaitStore(effects.conn), config.keys)
    if refused is not None:
        ending = _Ending(store, _resolver(config, registry, claim, worker, effects, None),
                         claim, step.name, bound)
        return ending.refuse(refused)

    clock = StepClock(claim.claimed_at)
    services = StepServices(
        effects=effects, evidence=evidence, run_id=claim.run_id, tenant_id=claim.tenant_id,
        seq=claim.seq, step=step.name, epoch=claim.epoch, worker=worker,
        llm_client=workflow.llm,
        control=claim.checkpoint.control if claim.checkpoint else None,
        tokens_left=limits.tokens_left(claim.budget),
        cost_left_usd=limits.cost_left(claim.budget), spent=claim.budget.spent(),
        launch=claim.launch, clock=clock,
        max_effect_payload_bytes=config.max_effect_payload_bytes,
        max_json_depth=config.max_json_depth,
        tool_timeout_s=config.tool_timeout_s, lease_margin_s=config.tool_lease_margin_s,
        model_timeout_s=config.model_timeout_s,
    )
    ending = _Ending(store, _resolver(config, registry, claim, worker, effects, services),
                     claim, step.name, bound)

    def heartbeat() -> bool:
        try:
            return store.heartbeat(claim)
        except CancelRequested as exc:
            raise services.cancelled(exc) from exc

    ctx = StepContext(
        run_id=claim.run_id, seq=claim.seq, attempt=claim.attempt, step=step.name,
        workflow=workflow, worker=worker, tenant_id=claim.tenant_id, services=services,
        _heartbeat=heartbeat,
    )
    started = time.perf_counter()
    outcome: object = None
    error: Exception | None = None
    try:
        faults.point("in_step", step.name)
        outcome = step(ctx, state)
    except Suspend:
        pass  # the decision is on services.control
    except (LeaseLost, EffectFenced, EvidenceFenced) as exc:
        bound.warning("lease lost during step; result discarded", error=str(exc))
        store.commit_refused(claim)
        return StepReport(ReportKind.LEASE_LOST, claim.run_id, claim.seq)
    except Exception as exc:
        error = exc
    if error is None and services.unknown:
        # the body caught an unknown outcome and went on: the step must not commit past it
        error = EffectOutcomeUnknown(
            f"step {step.name} went on after the outcome of effect "
            f"{next(iter(services.unknown.values()))} became unknown; the next attempt "
            "reconciles it")
    # A wait, a park, a budget stop or a cancel decided inside the step stands, whatever
    # the body caught or returned.
    decision = services.control.decision
    if isinstance(decision, CancelFor):
        return ending.cancel(decision.message)
    if isinstance(decision, DivergeFor):
        return _diverge(services, claim, decision, bound)
    if isinstance(decision, (ParkFor, FailFor)):
        return ending.refuse(decision)
    if isinstance(decision, WaitFor):
        if not store.defer(claim, step.name, delay_s=decision.delay_s,
                           waiting_on=decision.waiting_on, detail=decision.detail):
            return StepReport(ReportKind.LEASE_LOST, claim.run_id, claim.seq)
        bound.info("step waiting", waiting_on=decision.waiting_on, delay_s=decision.delay_s)
        return StepReport(ReportKind.WAITING, claim.run_id, claim.seq, detail=decision.detail)
    if error is not None:
        return _record_failure(ending, config, claim, error)
    try:
        advance = _advance(config, workflow, step, state, outcome, limits, clock.now())
        refs = services.refs(claim.budget.spent())
        if restored.migrated is not None:
            refs["migrated_from"] = restored.migrated.as_ref()
        advance = replace(advance, refs=refs)
    except OutcomeError as exc:
        return _record_failure(ending, config, claim, exc)
    replayed = services.replay_wait(advance)  # evidence replays follow recorded decisions
    if replayed is None and isinstance(services.control.decision, DivergeFor):
        return _diverge(services, claim, services.control.decision, bound)
    advance = replayed or advance

    faults.point("before_checkpoint_commit", step.name)
    try:
        committed = store.commit(claim, advance)
    except CancelRequested as exc:
        return ending.cancel(str(exc))
    except (StatementRefused, InvalidInput) as exc:  # nothing written: a step failure
        failure = OutcomeError(f"the ledger refused to commit step {step.name}: {exc}")
        return _record_failure(ending, config, claim, failure)
    if not committed:
        bound.warning("lease lost before commit; result discarded", step=step.name)
        return StepReport(ReportKind.LEASE_LOST, claim.run_id, claim.seq)
    faults.point("after_checkpoint_commit", step.name)
    bound.debug("step committed", step=step.name, next_step=advance.next_step,
                ms=round((time.perf_counter() - started) * 1000, 2))
    if restored.migrated is not None:
        bound.warning("run migrated to newer code", workflow=workflow.name,
                      from_version=restored.migrated.workflow_version,
                      to_version=workflow.version,
                      from_schema=restored.migrated.state_schema_version,
                      to_schema=workflow.state_schema_version)
    wait = advance.wait
    fast_path = advance.status is RunStatus.RUNNING and (wait is None or wait.due_at is None)
    next_seq = claim.seq + 1 if fast_path else None
    return StepReport(ReportKind.COMMITTED, claim.run_id, claim.seq, next_seq=next_seq,
                      queue=version_queue(config.queue, workflow.name, workflow.version),
                      workflow=workflow.name, version=workflow.version,
                      next_step=advance.next_step, status=advance.status.value)


def _hand_back(store: StepStore, config: ExecutorConfig, claim: Claim, refusal: Refusal,
               bound: Any) -> StepReport:
    """The run is bound to a version this worker lacks: give it back to the fleet without
    spending an attempt, backing off; after ``handback_limit`` hand-backs in a row (no
    worker with that version took it meanwhile), park it ``no_worker_for_version``."""
    handbacks = claim.handbacks + 1
    park = handbacks >= config.handback_limit
    delay = min(config.handback_max_delay_s, 2.0 ** min(handbacks - 1, 30))
    message = refusal.message
    if park:
        wanted = f"{claim.workflow} v{claim.workflow_version}"
        message = (f"no worker with {wanted} took the run: it was handed back {handbacks} "
                   f"times in a row by workers without it (last: {refusal.message}); deploy "
                   f"workers with {wanted} (ONWARD_WORKFLOWS), then `onward runs continue "
                   f"{claim.run_id}`")
    error = error_record("NoWorkerForVersion" if park else refusal.error_type, message,
                         handbacks=handbacks, workflow_version=claim.workflow_version)
    if not store.hand_back(claim, error, delay_s=delay, park=park):
        return StepReport(ReportKind.LEASE_LOST, claim.run_id, claim.seq)
    if park:
        bound.error("run parked for review", reason=ParkReason.NO_WORKER_FOR_VERSION,
                    detail=message)
        return StepReport(ReportKind.PARKED, claim.run_id, claim.seq, detail=message)
    bound.warning("step handed back for a worker with the run's version", detail=message,
                  handbacks=handbacks, resend_in_s=delay)
    return StepReport(ReportKind.RELEASED, claim.run_id, claim.seq, detail=message)


def _diverge(services: StepServices, claim: Claim, decision: DivergeFor,
             bound: Any) -> StepReport:
    """Stop an evidence replay that diverged from its parent, with the report on the run."""
    if not services.stop_diverged(decision):
        return StepReport(ReportKind.LEASE_LOST, claim.run_id, claim.seq)
    bound.error("replay diverged", detail=decision.message)
    return StepReport(ReportKind.DIVERGED, claim.run_id, claim.seq, detail=decision.message)


def _resolver(config: ExecutorConfig, registry: Registry, claim: Claim, worker: str,
              effects: EffectStore, services: StepServices | None) -> Resolver:
    """What resolves the run's unknown effects before it ends: the tools this step used,
    else those of the workflow modules."""
    used = services.tools_used if services is not None else {}
    return Resolver(effects, lambda name: used.get(name) or registry.tool(name), worker,
                    claim.epoch, config.tool_timeout_s, config.tool_lease_margin_s,
                    simulation=claim.launch.simulation)


@dataclass(frozen=True)
class _Ending:
    """Every way a claimed step ends the run (fail, refuse, cancel) or parks it: effects
    whose outcome is unknown are resolved first, and what stays unknown parks the run."""

    store: StepStore
    resolver: Resolver
    claim: Claim
    step: str | None
    log: Any

    def _report(self, kind: ReportKind, detail: str = "") -> StepReport:
        return StepReport(kind, self.claim.run_id, self.claim.seq, detail=detail)

    def refuse(self, refusal: FailFor | ParkFor) -> StepReport:
        """Park the run, or fail it for good with a reason (budgets, deadlines, approvals)."""
        if isinstance(refusal, ParkFor):
            return self.park(refusal.reason, refusal.error_type, refusal.message)
        error = error_record(refusal.reason, refusal.message, reason=refusal.reason,
                             spent=refusal.spent, step=self.step)
        return self.fail(error, refusal.message)

    def park(self, reason: ParkReason, error_type: str, message: str,
             **fields: Any) -> StepReport:
        self.log.error("run parked for review", reason=reason, detail=message, **fields)
        if not self.store.park(self.claim, self.step, reason,
                               error_record(error_type, message)):
            return self._report(ReportKind.LEASE_LOST)
        return self._report(ReportKind.PARKED, message)

    def _unknown(self) -> Effect | StepReport | None:
        try:
            return self.resolver.first_unknown(self.claim.run_id)
        except EffectFenced as exc:
            self.log.warning("lease lost while resolving effects", error=str(exc))
            self.store.commit_refused(self.claim)
            return self._report(ReportKind.LEASE_LOST)

    def _park_unknown(self, effect: Effect | None, why: str) -> StepReport:
        named = (f"effect {effect.effect_type} {effect.effect_id[:16]}… ({effect.status.value})"
                 if effect is not None else "an effect")
        return self.park(ParkReason.EFFECT_OUTCOME_UNKNOWN, "EffectOutcomeUnknown",
                         f"{why}; {named} may have reached the provider and its outcome is "
                         "unknown: a person checks the provider before anything else",
                         effect_id=effect.effect_id if effect is not None else None)

    def fail(self, error: dict[str, Any], detail: str) -> StepReport:
        """Fail the run for good, its never-sent effects closed in the same statement."""
        unknown = self._unknown()
        if isinstance(unknown, StepReport):
            return unknown
        if unknown is None:
            ended = self.store.fail_run(self.claim, self.step or "", error)
            if ended is Ended.LOST:
                return self._report(ReportKind.LEASE_LOST)
            if ended is Ended.ENDED:
                self.log.error("run stopped", reason=error.get("reason"), detail=detail)
                return self._report(ReportKind.FAILED, detail)
        return self._park_unknown(unknown, f"the run was to fail ({detail})")

    def cancel(self, message: str) -> StepReport:
        """Honour an operator's cancel request once no effect's outcome is unknown."""
        unknown = self._unknown()
        if isinstance(unknown, StepReport):
            return unknown
        if unknown is None:
            ended = self.store.end_cancelled(self.claim, self.step)
            if ended is Ended.LOST:
                return self._report(ReportKind.LEASE_LOST)
            if ended is Ended.ENDED:
                self.log.warning("run cancelled", detail=message)
                return self._report(ReportKind.CANCELLED, message)
        return self._park_unknown(unknown, f"the run was to be cancelled ({message}); "
                                           "cancel it again once the provider was checked")


def _advance(config: ExecutorConfig, workflow: Workflow[Any], step: Step, state: BaseModel,
             outcome: object, limits: Limits, now: datetime) -> Advance:
    """Turn a step's outcome into the next checkpoint, or raise OutcomeError."""
    defaults = limits.defaults_for_run()
    if isinstance(outcome, Goto):
        target = _target(workflow, step, outcome.step)
        new_state = _merge(workflow, state, outcome.update, config)
        return Advance(step.name, OutcomeKind.GOTO, target.name, new_state, workflow.version,
                       workflow.attempts_for(target), defaults=defaults,
                       state_schema_version=workflow.state_schema_version)
    if isinstance(outcome, (AskApproval, WaitSignal, Sleep)):
        then = _target(workflow, step, outcome.then)
        for other in _continuations(outcome):
            _target(workflow, step, other)
        if isinstance(outcome, AskApproval):
            _check_json(outcome.artifact, "approval artifact", config.max_json_depth,
                        config.max_approval_artifact_bytes, "ONWARD_MAX_APPROVAL_ARTIFACT_BYTES")
        new_state = _merge(workflow, state, outcome.update, config)
        return Advance(step.name, OutcomeKind.WAIT, then.name, new_state, workflow.version,
                       workflow.attempts_for(then), wait=build_wait(outcome, workflow, step, now),
                       defaults=defaults, state_schema_version=workflow.state_schema_version)
    state_json = _as_json(state, config)
    if isinstance(outcome, Finish):
        _check_json(outcome.result, "finish result", config.max_json_depth,
                    config.max_state_bytes)
        return Advance(step.name, OutcomeKind.FINISH, None, state_json, workflow.version, 1,
                       result=outcome.result, defaults=defaults,
                       state_schema_version=workflow.state_schema_version)
    if isinstance(outcome, Fail):
        result = {"reason": outcome.reason, **outcome.details}
        _check_json(result, "fail details", config.max_json_depth, config.max_state_bytes)
        return Advance(step.name, OutcomeKind.FAIL, None, state_json, workflow.version, 1,
                       result={"failed": result}, defaults=defaults,
                       state_schema_version=workflow.state_schema_version)
    raise OutcomeError(f"step {step.name} returned {type(outcome).__name__}; return "
                       "ctx.goto(...), ctx.finish(...) or ctx.fail(...)")


def _target(workflow: Workflow[Any], step: Step, name: str | None) -> Step:
    target = workflow.resolve(name) if name is not None else None
    if target is None:
        raise OutcomeError(f"step {step.name} went to unknown step {name!r} "
                           f"(steps: {list(workflow.steps)})")
    return target


def _continuations(outcome: AskApproval | WaitSignal | Sleep) -> list[str]:
    if isinstance(outcome, AskApproval):
        return [n for n in (outcome.on_reject, outcome.on_expire) if n is not None]
    if isinstance(outcome, WaitSignal):
        return [outcome.on_timeout] if outcome.on_timeout is not None else []
    return []


def _merge(workflow: Workflow[Any], state: BaseModel, update: dict[str, Any],
           config: ExecutorConfig) -> dict[str, Any]:
    unknown = set(update) - set(type(state).model_fields)
    if unknown:
        raise OutcomeError(f"state update names fields {sorted(unknown)} that "
                           f"{type(state).__name__} does not have")
    try:
        merged = workflow.state.model_validate({**state.model_dump(), **update})
    except ValidationError as exc:
        raise OutcomeError(f"state update is invalid for {type(state).__name__}: {exc}") from exc
    return _as_json(merged, config)


def _as_json(state: BaseModel, config: ExecutorConfig) -> dict[str, Any]:
    try:
        data = state.model_dump(mode="json")
    except Exception as exc:
        raise OutcomeError(f"state is not JSON-serializable: {exc}") from exc
    _check_json(data, "state", config.max_json_depth, config.max_state_bytes)
    return data


def _check_json(value: Any, what: str, max_depth: int, max_bytes: int,
                setting: str = "ONWARD_MAX_STATE_BYTES") -> None:
    """Refuse (OutcomeError) what the ledger cannot keep: not plain JSON, a NUL character,
    nested deeper than ``max_depth``, larger than ``max_bytes``."""
    try:
        size = len(canonical_json(value, max_depth=max_depth))
    except InvalidInput as exc:
        raise OutcomeError(f"{what} cannot be stored: {exc}") from exc
    if size > max_bytes:
        raise OutcomeError(f"{what} is {size} bytes, over the limit of {max_bytes} ({setting}); "
                           "keep large values out of the ledger and pass references")


def _record_failure(ending: _Ending, config: ExecutorConfig, claim: Claim,
                    exc: Exception) -> StepReport:
    non_retryable = isinstance(exc, StepError) and exc.non_retryable
    exhausted = claim.attempt >= claim.max_attempts
    error = error_record(type(exc).__name__, str(exc), step=ending.step, attempt=claim.attempt,
                         max_attempts=claim.max_attempts)
    if non_retryable or exhausted:
        ending.log.error("step failed; run fails", step=ending.step, error=str(exc),
                         non_retryable=non_retryable)
        return ending.fail(error, str(exc))
    retry_in = retry_delay(claim.attempt, config.retry_base_s, config.retry_max_s)
    if not ending.store.fail(claim, ending.step or "", error, retry_in_s=retry_in):
        return StepReport(ReportKind.LEASE_LOST, claim.run_id, claim.seq)
    ending.log.warning("step failed; retrying", step=ending.step, error=str(exc),
                       retry_in_s=round(retry_in, 3))
    return StepReport(ReportKind.RETRY, claim.run_id, claim.seq, detail=str(exc))
