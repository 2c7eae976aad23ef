"""What ``ctx.effect``, ``ctx.llm`` and ``ctx.read`` do: docs/design.md section 5, step by step.

Control flow that the step body must not be able to swallow (wait for an accepted effect,
park the run for review) is recorded on ``Control`` (tasks/control.py) before anything is
raised; the executor reads it after the body returns or raises, whatever the body caught.

Replays and branches (docs/design.md section 8) change where answers come from, by the run's
``Launch``: an **evidence** replay answers every call from its parent's records by
``command_id`` and calls nothing (a call without a matching record stops it as
``diverged``); a **simulation** runs each tool's ``simulate``; a **live** replay or a
**branch** calls for real but refuses irreversible effects unless explicitly allowed.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar
from uuid import UUID

import structlog

from ledger.checkpoints import canonical_json, sha256_hex
from ledger.effects import Effect, EffectStore, Intent
from ledger.evidence import Evidence, EvidenceRecord, EvidenceStore, Refusal
from ledger.exceptions import (
    CancelRequested,
    EffectConflict,
    EffectFenced,
    EvidenceFenced,
    IntegrityViolation,
    InvalidInput,
)
from ledger.limits import LimitStore, RetryStore
from ledger.lineage import Divergence, Launch, LineageStore, resume_after_wait
from ledger.steps import Advance, Wait
from ledger.vocabulary import (
    EffectAttemptKind,
    EffectAttemptOutcome,
    EffectStatus,
    EvidenceKind,
    FailReason,
    ParkReason,
    Priority,
    ToolClass,
    WaitKind,
)
from ledger.waits import WaitStore, check_decision, check_signal
from tasks import credentials, faults
from tasks.clock import StepClock
from tasks.control import CancelFor, Control, DivergeFor, FailFor, Suspend, WaitFor
from tasks.exceptions import EffectFailed, EffectOutcomeUnknown, OutcomeError, StepError, ToolError
from tasks.limits import Limit, LimitScope, declared_limits
from tasks.llm import LLMClient, LLMResponse, StreamTo, call_model
from tasks.retry import RetryPolicy, classify, default_policy, retry_after_s
from tasks.tools import Tool, ToolResult, invoke

T = TypeVar("T")
log = structlog.get_logger("onward.services")


def effect_id_for(run_id: UUID, effect_type: str, command_id: str) -> str:
    """``sha256(run_id : effect type : command_id)``: the provider's idempotency key."""
    return hashlib.sha256(f"{run_id}:{effect_type}:{command_id}".encode()).hexdigest()


def request_hash_of(payload: Any) -> str:
    try:
        return sha256_hex(canonical_json(payload))
    except InvalidInput as exc:
        raise OutcomeError(f"effect payload is not plain JSON: {exc}") from exc


def poll_delay(polls: int) -> float:
    return min(30.0, 0.25 * 2.0 ** min(polls, 10))


class StepServices:
    """Effects and evidence for one execution of one step."""

    def __init__(self, *, effects: EffectStore, evidence: EvidenceStore, run_id: UUID,
                 tenant_id: str, seq: int, step: str, epoch: int, worker: str,
                 llm_client: LLMClient | None, control: dict[str, Any] | None = None,
                 tokens_left: int | None = None, cost_left_usd: float | None = None,
                 spent: dict[str, Any] | None = None, launch: Launch | None = None,
                 clock: StepClock, max_effect_payload_bytes: int | None = None,
                 max_json_depth: int | None = None, tool_timeout_s: float = 30.0,
                 lease_margin_s: float = 5.0, model_timeout_s: float = 120.0,
                 priority: Priority = Priority.NORMAL, limit_poll_s: float = 5.0) -> None:
        self.effects = effects
        self.evidence = evidence
        self.run_id = run_id
        self.tenant_id = tenant_id
        self.seq = seq
        self.step = step
        self.epoch = epoch
        self.worker = worker
        self.llm_client = llm_client
        self.control = Control()
        self.checkpoint_control = control or {}
        self.tokens_left = tokens_left
        self.cost_left_usd = cost_left_usd
        self.spent = spent or {}
        self._ordinal = 0
        self._last_command = ""
        self._evidence_refs: list[dict[str, Any]] = []
        self._effect_refs: list[dict[str, Any]] = []
        self.usage_tokens = 0
        self.usage_cost_usd = 0.0
        self.launch = launch or Launch()
        self.clock = clock
        self.lineage = LineageStore(effects.conn)
        self.waits = WaitStore(effects.conn)
        self._source: UUID | None = None
        self._source_known = False
        self.max_effect_payload_bytes = max_effect_payload_bytes
        self.max_json_depth = max_json_depth
        self.tool_timeout_s = tool_timeout_s
        # a model call's time limit: the client's own (``timeout_s``), else the default
        self.model_timeout_s = float(getattr(llm_client, "timeout_s", None) or model_timeout_s)
        self.lease_margin_s = lease_margin_s
        self.tools_used: dict[str, Tool] = {}  # by name: what resolves effects if the run ends
        self.priority = Priority(priority)
        self.limit_poll_s = limit_poll_s  # a throttled call asks again then, if not woken
        self.retries = RetryStore(effects.conn)
        self.limits = LimitStore(effects.conn)
        self.model_limits = declared_limits(llm_client)
        model_retry = getattr(llm_client, "retry", None)
        self.model_retry = (model_retry if isinstance(model_retry, RetryPolicy)
                            else default_policy(ToolClass.READ))
        self.unknown: dict[str, str] = {}  # effect id -> tool: outcomes this step left unknown

    def command_id(self, key: str | None) -> str:
        """The call's intent, stable across retries of this step: step, seq, ordinal or key."""
        if key is not None:
            self._last_command = f"{self.step}@{self.seq}:{key}"
        else:
            self._ordinal += 1
            self._last_command = f"{self.step}@{self.seq}#{self._ordinal}"
        return self._last_command

    def refs(self, spent: dict[str, Any]) -> dict[str, Any]:
        """What the checkpoint this step commits binds under its MAC (docs/design.md section 9):
        the evidence and effects the step used, and the budgets it started with."""
        return {"evidence": self._evidence_refs, "effects": self._effect_refs, "budgets": spent}

    # -- effects ---------------------------------------------------------------------------
    def cancelled(self, exc: CancelRequested) -> Suspend:
        """Record the operator's cancel on ``control`` (the body cannot swallow it)."""
        self.control.cancel(CancelFor(str(exc)))
        return Suspend()

    def timeout(self, tool: Tool) -> float:
        return tool.timeout_for(self.tool_timeout_s)

    def _begin(self, tool: Tool, effect: Effect, kind: EffectAttemptKind) -> int:
        """Record the attempt and extend the lease over the call's time limit (one statement)."""
        return self.effects.begin_attempt(effect, kind, worker=self.worker, epoch=self.epoch,
                                          cover_s=self.timeout(tool) + self.lease_margin_s)

    def _record_effect(self, effect: Effect, attempt: int, **outcome: Any) -> Effect:
        recorded = self.effects.record(effect, attempt, epoch=self.epoch, **outcome)
        if recorded.status is not EffectStatus.PENDING:
            self.unknown.pop(effect.effect_id, None)
        return recorded

    def effect(self, tool: Tool, key: str | None, payload: dict[str, Any]) -> dict[str, Any]:
        self.tools_used[tool.name] = tool
        try:
            result = self._effect(tool, key, payload)
        except CancelRequested as exc:
            raise self.cancelled(exc) from exc
        # An evidence replay's answer is the parent's effect: the checkpoint names that one.
        owner = (self._evidence_source() if self.launch.evidence else None) or self.run_id
        self._effect_refs.append({
            "effect_type": tool.name, "command_id": self._last_command,
            "effect_id": effect_id_for(owner, tool.name, self._last_command),
            "status": EffectStatus.COMPLETED.value,
        })
        return result

    def _effect(self, tool: Tool, key: str | None, payload: dict[str, Any]) -> dict[str, Any]:
        if tool.tool_class is ToolClass.READ:
            raise OutcomeError(f"tool {tool.name} is a read: use ctx.read, not ctx.effect")
        command_id = self.command_id(key)
        request_hash = self._payload_hash(payload)
        if self.launch.evidence:
            return self._recorded_effect(tool, command_id, request_hash, payload)
        self._check_launch_allows(tool, command_id)
        effect, created = self._verified(lambda: self.effects.intend(Intent(
            effect_id=effect_id_for(self.run_id, tool.name, command_id),
            effect_type=tool.name, run_id=self.run_id, tenant_id=self.tenant_id, seq=self.seq,
            step=self.step, command_id=command_id, tool_class=tool.tool_class.value,
            request_hash=request_hash,
            recipient=tool.recipient(payload) if tool.recipient else None,
            payload=payload if tool.store_payload else None,
            lease_epoch=self.epoch,
        )))
        if effect.request_hash != request_hash:
            conflict = EffectConflict(
                f"effect {effect.effect_id[:16]}… ({tool.name}, {command_id}) was first "
                f"requested with a different payload (hash {effect.request_hash[:12]}…, now "
                f"{request_hash[:12]}…); a key must not change its request")
            self.control.park(ParkReason.EFFECT_CONFLICT, conflict)
            raise conflict
        if effect.status is EffectStatus.COMPLETED:
            return effect.result or {}
        if effect.status is EffectStatus.FAILED:
            raise EffectFailed(f"effect {tool.name} ({command_id}) failed earlier: "
                               f"{effect.error}", effect)
        if created:
            faults.point("after_effect_pending", self.step)
            return self._send(tool, effect, payload)
        if effect.status is EffectStatus.ACCEPTED:
            return self._poll(tool, effect)
        if not effect.outcome_unknown:
            # never sent, or every call refused and a lookup found nothing: send, same key
            return self._send(tool, effect, payload)
        return self._reconcile(tool, effect, payload)

    def _payload_hash(self, payload: dict[str, Any]) -> str:
        """The request hash of an effect payload within the configured limits (depth,
        ONWARD_MAX_EFFECT_PAYLOAD_BYTES): a payload over them is never sent."""
        try:
            body = canonical_json(payload, max_depth=self.max_json_depth)
        except InvalidInput as exc:
            raise OutcomeError(f"effect payload is not plain JSON: {exc}") from exc
        if credentials.held_in(body):
            raise OutcomeError("effect payload holds the value of a tool credential: nothing "
                               "was sent or recorded; pass no credential in a payload, the tool "
                               "resolves secret://NAME when it calls (docs/security.md)")
        limit = self.max_effect_payload_bytes
        if limit is not None and len(body) > limit:
            raise OutcomeError(f"effect payload is {len(body)} bytes, over the limit of {limit} "
                               "(ONWARD_MAX_EFFECT_PAYLOAD_BYTES); nothing was sent: send a "
                               "reference to the document, not the document")
        return sha256_hex(body)

    def _reconcile(self, tool: Tool, effect: Effect, payload: dict[str, Any]) -> dict[str, Any]:
        """An earlier attempt left the outcome unknown: ask before sending again."""
        if self.launch.simulation:
            return self._send(tool, effect, payload)  # a sandbox is never asked for real
        if effect.call_overran and not tool.honours_key:
            overran = EffectOutcomeUnknown(
                f"effect {effect.effect_id[:16]}… ({tool.name}): an earlier call was still in "
                "flight past its time limit (the tool did not keep to its timeout) and has "
                "not ended: it may still land, so neither a lookup nor a resend can be trusted "
                "now; a person checks the provider (onward effects resolve)")
            self.control.park(ParkReason.EFFECT_OUTCOME_UNKNOWN, overran)
            raise overran
        if tool.lookup is None:
            if tool.can_resend_blind:
                return self._send(tool, effect, payload)
            unknown = EffectOutcomeUnknown(
                f"effect {effect.effect_id[:16]}… ({tool.name}) may have reached the provider, "
                "and the tool has neither a lookup nor provider-side idempotency: a person must "
                "check the provider before anything is sent again")
            self.control.park(ParkReason.EFFECT_OUTCOME_UNKNOWN, unknown)
            raise unknown
        attempt = self._begin(tool, effect, EffectAttemptKind.LOOKUP)
        try:
            found = invoke(tool.lookup, effect.effect_id, timeout=self.timeout(tool))
        except Exception as exc:
            self._record_effect(effect, attempt, outcome=EffectAttemptOutcome.UNKNOWN,
                                status=effect.status, error=_error(exc))
            self.unknown[effect.effect_id] = tool.name
            raise EffectOutcomeUnknown(f"lookup of {tool.name} failed: {exc}") from exc
        if found is None:  # the earlier call never landed: send again, same key
            self._record_effect(effect, attempt, outcome=EffectAttemptOutcome.MISSING,
                                status=EffectStatus.PENDING)
            return self._send(tool, replace(effect, call_unknown=False), payload)
        return self._apply(tool, effect, attempt, ToolResult.coerce(found), reconciled=True)

    def _send(self, tool: Tool, effect: Effect, payload: dict[str, Any]) -> dict[str, Any]:
        limits = () if self.launch.simulation else tool.limits
        held = self._acquire(limits, tool.name, effect.command_id, self.timeout(tool))
        try:
            attempt = self._begin(tool, effect, EffectAttemptKind.CALL)
            call = tool.simulate if self.launch.simulation and tool.simulate else tool.call
            raw: Any = None
            failure: Exception | None = None
            try:
                with self._overrun_guard(tool, effect, attempt):
                    raw = invoke(call, payload, effect.effect_id, timeout=self.timeout(tool))
            except Exception as exc:
                failure = exc
        finally:
            self._release(held, effect.command_id)
        try:
            return self._sent(tool, effect, attempt, raw, failure)
        except EffectFenced:
            self._answered_late(tool, effect, attempt, raw, failure)
            raise

    def _overrun_guard(self, tool: Tool, effect: Effect, attempt: int) -> Any:
        """While the call runs: should it still be in flight halfway through the lease
        margin past its time limit (a tool that does not keep to its timeout), mark it
        ``CallOverran`` before the lease runs out, so the next holder does not trust a
        lookup while the request may still land (docs/effects.md). Nothing extends the
        lease past the time the call was covered for."""
        timeout = self.timeout(tool)

        def mark() -> None:
            self.effects.mark_overran(effect, attempt, epoch=self.epoch, timeout_s=timeout)

        return overrun_guard(timeout + self.lease_margin_s / 2, mark)

    def _answered_late(self, tool: Tool, effect: Effect, attempt: int, raw: Any,
                       failure: Exception | None) -> None:
        """The call ended after its lease was lost: record its attempt ``unknown`` with what
        it said (the next holder reconciles by lookup), and never commit past it."""
        self.unknown[effect.effect_id] = tool.name
        if failure is not None:
            what, ref = f"the call ended with {type(failure).__name__}: {failure}"[:500], None
        else:
            try:
                answer = ToolResult.coerce(raw)
                what, ref = f"the provider answered {answer.status}", answer.provider_ref
            except TypeError:
                what, ref = "the tool returned something that is not a ToolResult", None
        self.effects.record_late(effect, attempt, epoch=self.epoch, what=what,
                                 provider_ref=ref)

    def _sent(self, tool: Tool, effect: Effect, attempt: int, raw: Any,
              failure: Exception | None) -> dict[str, Any]:
        """Record what the call came to (raises EffectFenced once the lease was lost)."""
        try:
            if failure is not None:
                raise failure
        except ToolError as exc:
            if exc.retryable:  # nothing happened *this time*: an earlier call may have landed
                self._record_effect(effect, attempt, outcome=EffectAttemptOutcome.FAILED,
                                    status=EffectStatus.PENDING, error=_error(exc))
                if effect.outcome_unknown:
                    self.unknown[effect.effect_id] = tool.name
                self._retry_later(tool.retry_policy, effect.command_id, exc, tool.name)
                raise EffectOutcomeUnknown(f"{tool.name} refused for now: {exc}") from exc
            failed = self._record_effect(effect, attempt, outcome=EffectAttemptOutcome.FAILED,
                                  status=EffectStatus.FAILED, error=_error(exc))
            raise EffectFailed(f"{tool.name} refused: {exc}", failed) from exc
        except Exception as exc:
            self._record_effect(effect, attempt, outcome=EffectAttemptOutcome.UNKNOWN,
                                status=EffectStatus.PENDING, error=_error(exc))
            self.unknown[effect.effect_id] = tool.name
            if tool.can_resend_blind:  # the provider dedupes by key: a resend is safe
                self._retry_later(tool.retry_policy, effect.command_id, exc, tool.name)
            raise EffectOutcomeUnknown(
                f"{tool.name} call ended without an answer ({type(exc).__name__}: {exc}); "
                "the next attempt reconciles before sending again") from exc
        faults.point("after_provider_response", self.step)
        return self._apply(tool, effect, attempt, ToolResult.coerce(raw), reconciled=False)

    def _apply(self, tool: Tool, effect: Effect, attempt: int, answer: ToolResult, *,
               reconciled: bool, poll: bool = False) -> dict[str, Any]:
        """Record what the provider said and act on it."""
        outcome = EffectAttemptOutcome.FOUND if reconciled else answer.outcome
        if answer.outcome is EffectAttemptOutcome.COMPLETED:
            done = self._record_effect(effect, attempt, outcome=outcome,
                                       status=EffectStatus.COMPLETED,
                                       provider_ref=answer.provider_ref, result=answer.result,
                                       reconciled=reconciled, poll=poll)
            faults.point("after_effect_recorded", self.step)
            if done.status is EffectStatus.FAILED:
                raise EffectFailed(f"effect {tool.name} failed: {done.error}", done)
            return done.result or {}
        if answer.outcome is EffectAttemptOutcome.ACCEPTED:
            accepted = self._record_effect(effect, attempt, outcome=outcome,
                                           status=EffectStatus.ACCEPTED,
                                           provider_ref=answer.provider_ref,
                                           reconciled=reconciled, poll=poll)
            faults.point("after_effect_recorded", self.step)
            if accepted.status is EffectStatus.COMPLETED:
                return accepted.result or {}
            return self._wait(tool, accepted)
        failed = self._record_effect(effect, attempt, outcome=outcome, status=EffectStatus.FAILED,
                                     provider_ref=answer.provider_ref,
                                     error={"provider": answer.result}, reconciled=reconciled,
                                     poll=poll)
        raise EffectFailed(f"{tool.name} reported failure: {answer.result}", failed)

    def _poll(self, tool: Tool, effect: Effect) -> dict[str, Any]:
        """The provider accepted the job earlier: ask whether it is done."""
        if self.launch.simulation:
            sandbox = EffectOutcomeUnknown(
                f"the sandbox of {tool.name} answered 'accepted'; a simulation cannot poll the "
                "real provider for its status (make simulate answer 'completed')")
            self.control.park(ParkReason.SIMULATION_ACCEPTED, sandbox)
            raise sandbox
        if tool.status is None or effect.provider_ref is None:
            stuck = EffectOutcomeUnknown(
                f"effect {effect.effect_id[:16]}… ({tool.name}) was accepted but the tool has "
                "no status call (or the provider gave no reference) to learn its outcome")
            self.control.park(ParkReason.EFFECT_UNPOLLABLE, stuck)
            raise stuck
        age = (self.clock.now() - (effect.polling_since or effect.created_at)).total_seconds()
        stalled = age > tool.status_timeout_s  # past it: one last poll, then a person decides
        attempt = self._begin(tool, effect, EffectAttemptKind.STATUS)
        try:
            answer = ToolResult.coerce(invoke(tool.status, effect.provider_ref,
                                              timeout=self.timeout(tool)))
        except Exception as exc:
            polled = self._record_effect(effect, attempt, outcome=EffectAttemptOutcome.UNKNOWN,
                                  status=EffectStatus.ACCEPTED, error=_error(exc), poll=True)
            return self._stall(tool, effect, age) if stalled else self._wait(tool, polled)
        if stalled and answer.status == "accepted":
            self._record_effect(effect, attempt, outcome=EffectAttemptOutcome.ACCEPTED,
                                status=EffectStatus.ACCEPTED, provider_ref=answer.provider_ref,
                                poll=True)
            return self._stall(tool, effect, age)
        return self._apply(tool, effect, attempt, answer, reconciled=False, poll=True)

    def _stall(self, tool: Tool, effect: Effect, age: float) -> dict[str, Any]:
        """Still accepted past the tool's ``status_timeout_s`` (its last poll said so): park
        the run ``effect_stalled`` for a person."""
        stalled = EffectOutcomeUnknown(
            f"effect {effect.effect_id[:16]}… ({tool.name}) is still accepted after "
            f"{age:.0f}s (limit {tool.status_timeout_s:.0f}s): check the job at the "
            "provider, then `onward runs continue` to poll it again for as long, or "
            "`onward effects resolve` to record what it came to")
        self.control.park(ParkReason.EFFECT_STALLED, stalled)
        raise stalled

    def _wait(self, tool: Tool, effect: Effect) -> dict[str, Any]:
        delay = poll_delay(effect.polls)
        self.control.wait(WaitFor(delay, f"effect:{effect.effect_id}",
                                  f"{tool.name} accepted; polling status in {delay:.2f}s"))
        raise Suspend()

    # -- evidence --------------------------------------------------------------------------
    def llm(self, *, model: str, messages: list[dict[str, Any]], key: str | None,
            params: dict[str, Any]) -> LLMResponse:
        request_hash = request_hash_of({"model": model, "messages": messages, "params": params})
        try:
            response = self._llm(model, messages, key, params, request_hash)
        except CancelRequested as exc:
            raise self.cancelled(exc) from exc
        self._evidence_refs.append({"kind": EvidenceKind.LLM.value,
                                    "command_id": self._last_command,
                                    "request_hash": request_hash})
        return response

    def _llm(self, model: str, messages: list[dict[str, Any]], key: str | None,
             params: dict[str, Any], request_hash: str) -> LLMResponse:
        command_id = self.command_id(key)
        request = {"model": model, "messages": messages, "params": params}
        if self.launch.evidence:
            return LLMResponse.from_record(
                self._parent_record(EvidenceKind.LLM, command_id, request_hash, request))
        recorded = self._recorded(command_id, request_hash, self.model_timeout_s)
        if recorded is not None:
            return LLMResponse.from_record(recorded)
        if self.llm_client is None:
            raise StepError("no model client: pass Workflow(..., llm=client)", non_retryable=True)
        self._check_budget(model)
        stream_to = StreamTo(self.run_id, self.seq, command_id) if params.get("stream") else None
        client = self.llm_client
        response = self._limited_call(
            self.model_limits, self.model_retry, model, command_id, self.model_timeout_s,
            lambda: call_model(client, model=model, messages=messages, params={
                k: v for k, v in params.items() if k != "stream"}, stream_to=stream_to))
        kept = self._record(EvidenceRecord(
            run_id=self.run_id, command_id=command_id, kind=EvidenceKind.LLM.value,
            seq=self.seq, step=self.step, source=model, source_version=response.model,
            request_hash=request_hash, response=response.as_record(),
            input_tokens=response.input_tokens, output_tokens=response.output_tokens,
            cost_usd=response.cost_usd, lease_epoch=self.epoch, request=request,
        ))
        self.usage_tokens += response.input_tokens + response.output_tokens
        self.usage_cost_usd += response.cost_usd
        return LLMResponse.from_record(kept.response)

    def _check_budget(self, model: str) -> None:
        """A model call that would start over budget is not made; the run fails. What the
        run had spent at the claim includes every answer recorded at this seq (each was
        debited when recorded), so ``usage_*`` counts only this attempt's new calls."""
        over = None
        if self.tokens_left is not None and self.usage_tokens >= self.tokens_left:
            over = f"token budget spent ({self.usage_tokens} of {self.tokens_left} left)"
        if self.cost_left_usd is not None and self.usage_cost_usd >= self.cost_left_usd:
            over = f"cost budget spent (${self.usage_cost_usd:.4f} of ${self.cost_left_usd:.4f})"
        if over is not None:
            spent = {**self.spent, "step_tokens": self.usage_tokens,
                     "step_cost_usd": self.usage_cost_usd,
                     "tokens": self.spent.get("tokens", 0) + self.usage_tokens,
                     "cost_usd": self.spent.get("cost_usd", 0.0) + self.usage_cost_usd}
            self.control.fail(FailFor(FailReason.BUDGET_EXHAUSTED,
                                      f"{over}; not calling {model}", spent))
            raise Suspend()

    def decision(self) -> Any:
        approval_id = self.checkpoint_control.get("approval_id")
        if self.checkpoint_control.get("kind") != "approval" or approval_id is None:
            return None
        return self.waits.approval(approval_id)

    def signal_payload(self, name: str) -> Any:
        """The payload of the signal that ended this step's wait (its source's, in an
        evidence replay), if it verifies: an edited signal parks the run (integrity)."""
        if self.launch.evidence:
            source = self._evidence_source()
            row = self.lineage.signal_at(source, name, self.seq) if source else None
        else:
            row = self.waits.signal(self.run_id, name, self.seq)
        if row is None:
            return None
        found = row
        self._verified(lambda: check_signal(self.evidence.keys, found))
        return row["payload"]

    def read(self, tool: Tool, key: str | None, params: dict[str, Any]) -> dict[str, Any]:
        if tool.tool_class is not ToolClass.READ:
            raise OutcomeError(f"tool {tool.name} is {tool.tool_class.value}: use ctx.effect")
        request_hash = request_hash_of(params)
        try:
            result = self._read(tool, key, params, request_hash)
        except CancelRequested as exc:
            raise self.cancelled(exc) from exc
        self._evidence_refs.append({"kind": EvidenceKind.READ.value,
                                    "command_id": self._last_command,
                                    "request_hash": request_hash})
        return result

    def _read(self, tool: Tool, key: str | None, params: dict[str, Any],
              request_hash: str) -> dict[str, Any]:
        command_id = self.command_id(key)
        if self.launch.evidence:
            return dict(self._parent_record(EvidenceKind.READ, command_id, request_hash,
                                            params)["result"])
        recorded = self._recorded(command_id, request_hash, self.timeout(tool))
        if recorded is not None:
            return dict(recorded["result"])
        answer = ToolResult.coerce(self._limited_call(
            tool.limits, tool.retry_policy, tool.name, command_id, self.timeout(tool),
            lambda: invoke(tool.call, params, command_id, timeout=self.timeout(tool))))
        kept = self._record(EvidenceRecord(
            run_id=self.run_id, command_id=command_id, kind=EvidenceKind.READ.value,
            seq=self.seq, step=self.step, source=tool.name, source_version=answer.version,
            request_hash=request_hash,
            response={"result": answer.result, "version": answer.version,
                      "read_at": self.clock.now().isoformat()},
            lease_epoch=self.epoch, request=params if tool.store_payload else None,
        ))
        return dict(kept.response["result"])

    # -- limits and retries (docs/limits.md) ---------------------------------------------------
    def _limited_call(self, limits: tuple[Limit, ...], policy: RetryPolicy, target: str,
                      command_id: str, timeout_s: float, call: Callable[[], T]) -> T:
        """Make a model call or a read: within a slot of each of ``limits`` (or wait for
        one without a worker), its retryable failures deferred per ``policy``."""
        held = self._acquire(limits, target, command_id, timeout_s)
        try:
            return call()
        except Exception as exc:
            self._retry_later(policy, command_id, exc, target)
            raise
        finally:
            self._release(held, command_id)

    def _acquire(self, limits: tuple[Limit, ...], target: str, command_id: str,
                 timeout_s: float) -> list[str]:
        """A slot of each limit for this call; the keys held. When one is not free, give
        back those taken and wait in its queue (the step is deferred: no worker, no lease,
        no attempt spent), woken when a slot frees or after ``retry_in_s``."""
        held: list[str] = []
        scope = LimitScope(self.tenant_id, target)
        for limit in limits:
            key = limit.key(scope)
            grant = self.limits.acquire(
                key, limit.name, concurrency=limit.concurrency, rate=limit.rate_window,
                run_id=self.run_id, seq=self.seq, command_id=command_id, epoch=self.epoch,
                rank=self.priority.rank, hold_s=timeout_s + self.lease_margin_s,
                wait_s=self.limit_poll_s)
            if not grant.granted:
                self._release(held, command_id)
                self.control.wait(WaitFor(
                    grant.retry_in_s, f"{WaitKind.LIMIT.value}:{key}",
                    f"{target}: limit {key} full ({grant.in_use} in flight, "
                    f"{grant.waiting} waiting); asking again in {grant.retry_in_s:.2f}s "
                    "or when a slot frees"))
                raise Suspend()
            held.append(key)
        return held

    def _release(self, held: list[str], command_id: str) -> None:
        for key in held:
            try:
                self.limits.release(key, run_id=self.run_id, command_id=command_id,
                                    epoch=self.epoch)
            except Exception as exc:  # the slot expires with the call's cover instead
                log.warning("could not give a limit's slot back", key=key, error=str(exc))
        held.clear()

    def _retry_later(self, policy: RetryPolicy, command_id: str, exc: Exception,
                     target: str) -> None:
        """Defer the step to retry the call, when ``policy`` retries this failure and
        attempts are left (counted in the ledger); otherwise return and let it raise."""
        failure = classify(exc)
        if not policy.retries(failure) or policy.attempts <= 1:
            return
        error = {**_error(exc), "failure": str(failure)}
        failures = self.retries.count_failure(self.run_id, self.seq, command_id,
                                              epoch=self.epoch, error=error)
        if failures is None or failures >= policy.attempts:
            return  # the lease is lost, or the call's attempts are spent: the error stands
        delay = policy.delay_s(failures, retry_after_s(exc))
        self.control.wait(WaitFor(
            delay, f"{WaitKind.RETRY.value}:{command_id}",
            f"{target} failed ({failure}, {failures} of {policy.attempts} attempts): "
            f"retrying in {delay:.2f}s"))
        raise Suspend() from exc

    def _verified(self, read: Callable[[], T]) -> T:
        """What ``read`` returns, unless it does not verify against its MAC: then the run is
        parked (integrity) and nothing is answered with the edited record."""
        try:
            return read()
        except IntegrityViolation as exc:
            self.control.park(ParkReason.INTEGRITY, exc)
            raise

    def _find(self, run_id: UUID, command_id: str) -> Evidence | None:
        """A recorded answer that verifies; one that does not parks the run (integrity):
        an edited record is never answered with, and nothing is asked again in its place."""
        return self._verified(lambda: self.evidence.find(run_id, command_id))

    def _find_or_cover(self, command_id: str, cover_s: float) -> Evidence | Refusal | None:
        """``_find`` for this run, or the standing refusal of an answer to ``command_id``;
        with neither, the lease is extended over the call about to be made, in the same
        statement (``EvidenceStore.find_or_cover``)."""
        return self._verified(lambda: self.evidence.find_or_cover(
            self.run_id, command_id, epoch=self.epoch, cover_s=cover_s))

    def _record(self, record: EvidenceRecord) -> Evidence:
        """Record an answer. One the ledger cannot keep (a NUL character, nested too deeply,
        too large) stops the run as failed with its spend debited and its refusal recorded
        (one statement), rather than being paid for again on a retry; the step body cannot
        swallow that."""
        record = replace(record, tenant_id=self.tenant_id)  # binds a sealed answer
        try:
            return self.evidence.record(record)
        except IntegrityViolation as exc:  # another attempt's record came first: edited
            self.control.park(ParkReason.INTEGRITY, exc)
            raise
        except EvidenceFenced:
            # the lease was lost while the call ran (it overran its time limit): the answer
            # is never used, but what it cost was paid, so the budgets count it
            if record.input_tokens or record.output_tokens or record.cost_usd:
                self.evidence.debit_late(record)
            raise
        except InvalidInput as exc:
            # the debit and the refusal are one statement: a worker killed before the run is
            # failed leaves the refusal, and the retried step fails without calling again
            self.evidence.refuse(record, str(exc))
            faults.point("after_answer_refused", self.step)
            tokens = record.input_tokens + record.output_tokens
            self.usage_tokens += tokens
            self.usage_cost_usd += record.cost_usd
            spent = {**self.spent, "tokens": self.spent.get("tokens", 0) + self.usage_tokens,
                     "cost_usd": self.spent.get("cost_usd", 0.0) + self.usage_cost_usd}
            self._refused(record.kind, record.source, record.command_id, str(exc), tokens,
                          record.cost_usd, spent)
            raise Suspend() from exc

    def _refused(self, kind: str, source: str, command_id: str, reason: str, tokens: int,
                 cost_usd: float, spent: dict[str, Any]) -> None:
        """Fail the run ``invalid_answer``: an answer was paid for and could not be recorded."""
        self.control.fail(FailFor(
            FailReason.INVALID_ANSWER,
            f"the {kind} answer of {source} to {command_id} cannot be recorded: {reason}. It "
            f"was paid for ({tokens} tokens, ${cost_usd:.4f}, debited) and no retry asks "
            "again; once the client, tool or provider that produced it is fixed, continue "
            "the run: its step asks again, and that call is paid again", spent))

    def _recorded(self, command_id: str, request_hash: str,
                  timeout_s: float) -> dict[str, Any] | None:
        """The recorded answer, if any. With none, the call that follows is covered: the
        live lease is extended over its time limit ``timeout_s`` and the margin, in the same
        statement; CancelRequested once a cancel was asked (a cancelled step calls no model
        and reads nothing more), EvidenceFenced once the lease is lost (nothing called)."""
        found = self._find_or_cover(command_id, timeout_s + self.lease_margin_s)
        if found is None:
            return None
        if isinstance(found, Refusal):  # an earlier attempt's answer could not be recorded
            self._refused(found.kind, found.source, command_id, found.reason, found.tokens,
                          float(found.cost_usd), self.spent)
            raise Suspend()
        if found.request_hash != request_hash:
            conflict = EffectConflict(
                f"{command_id} was recorded for a different request (hash "
                f"{found.request_hash[:12]}…, now {request_hash[:12]}…): the step is not "
                "deterministic up to this call")
            self.control.park(ParkReason.EVIDENCE_CONFLICT, conflict)
            raise conflict
        return dict(found.response)

    # -- replays and branches (docs/design.md section 8) -----------------------------------------
    def _check_launch_allows(self, tool: Tool, command_id: str) -> None:
        """Refuse, before any intent is recorded, what this run's mode must not send."""
        if self.launch.simulation and tool.simulate is None:
            self.control.fail(FailFor(
                FailReason.NO_SIMULATION, f"simulation replay: {tool.name} ({command_id}) has no "
                "simulate implementation, and a simulation never calls the real provider",
                self.spent))
            raise Suspend()
        if self.launch.blocks_irreversible and tool.tool_class is ToolClass.IRREVERSIBLE:
            mode = self.launch.mode.value if self.launch.mode else "live"
            self.control.fail(FailFor(
                FailReason.IRREVERSIBLE_BLOCKED, f"{mode} run: {tool.name} ({command_id}) is "
                "irreversible and this run was not started with allow_irreversible; nothing "
                "was sent (start a new one with --allow-irreversible to send it)", self.spent))
            raise Suspend()

    def _evidence_source(self) -> UUID | None:
        """The ancestor whose records an evidence replay answers from (looked up once)."""
        if not self._source_known:
            self._source = self._verified(
                lambda: self.lineage.evidence_source(self.run_id, self.evidence.keys))
            self._source_known = True
        return self._source

    def _diverge(self, kind: str, why: str, command_id: str, message: str,
                 **details: Any) -> Suspend:
        divergence = Divergence(kind, why, self.step, self.seq, command_id, message,
                                details or None)
        report = divergence.report(self.launch.parent_run_id, self._source)
        self.control.diverge(DivergeFor(divergence, report))
        return Suspend()

    def _parent_record(self, kind: EvidenceKind, command_id: str, request_hash: str,
                       request: Any) -> dict[str, Any]:
        source = self._evidence_source()
        found = self._find(source, command_id) if source is not None else None
        if found is None:
            raise self._diverge(kind.value, "no_record", command_id,
                                f"step {self.step} at seq {self.seq} made {kind.value} call "
                                f"{command_id}, which the parent never made",
                                request_hash=request_hash, request=_shown(request))
        if found.kind != kind.value or found.request_hash != request_hash:
            raise self._diverge(
                kind.value, "request_differs", command_id,
                f"step {self.step} at seq {self.seq}: {kind.value} call {command_id} asks "
                f"for something else than the parent recorded (request hash "
                f"{request_hash[:12]}…, recorded {found.request_hash[:12]}… as "
                f"{found.kind} from {found.source})",
                request_hash=request_hash, recorded_request_hash=found.request_hash,
                request=_shown(request))
        return dict(found.response)

    def _recorded_effect(self, tool: Tool, command_id: str, request_hash: str,
                         payload: dict[str, Any]) -> dict[str, Any]:
        source = self._evidence_source()
        recorded = (self.lineage.effect(tool.name, effect_id_for(source, tool.name, command_id))
                    if source is not None else None)
        if recorded is not None:
            found = recorded
            recorded = self._verified(lambda: self.effects.check(found))
        shown = _shown(payload) if tool.store_payload else None
        if recorded is None:
            raise self._diverge("effect", "no_record", command_id,
                                f"step {self.step} at seq {self.seq} asked for effect "
                                f"{tool.name} ({command_id}), which the parent never requested",
                                request_hash=request_hash, request=shown)
        if recorded.request_hash != request_hash:
            raise self._diverge(
                "effect", "request_differs", command_id,
                f"step {self.step} at seq {self.seq}: effect {tool.name} ({command_id}) has "
                f"another payload than the parent's (request hash {request_hash[:12]}…, "
                f"recorded {recorded.request_hash[:12]}…)",
                request_hash=request_hash, recorded_request_hash=recorded.request_hash,
                request=shown)
        if recorded.status is EffectStatus.COMPLETED:
            return recorded.result or {}
        if recorded.status is EffectStatus.FAILED:
            raise EffectFailed(f"effect {tool.name} ({command_id}) failed in the parent run: "
                               f"{recorded.error}", recorded)
        raise self._diverge("effect", "no_outcome", command_id,
                            f"the parent's effect {tool.name} ({command_id}) is "
                            f"{recorded.status.value}: its outcome was never recorded")

    def replay_wait(self, advance: Advance) -> Advance | None:
        """In an evidence replay, a wait is not waited for: follow the decision the source
        recorded for the same seq (approval, signal) or go on at once (timer). None means
        the replay diverged (the decision is on ``control``)."""
        wait = advance.wait
        if not self.launch.evidence or wait is None:
            return advance
        control = dict(wait.control)
        seq = self.seq + 1
        try:
            source = self._evidence_source()
        except IntegrityViolation:  # an ancestor's launch was edited: parked
            return None
        approval = (self.lineage.approval_at(source, seq)
                    if source is not None and control.get("kind") == "approval" else None)
        signal = (self.lineage.signal_at(source, str(control.get("name")), seq)
                  if source is not None and control.get("kind") == "signal" else None)
        timed_out = (self.lineage.step_after(source, seq) if source is not None and signal is None
                     and control.get("kind") == "signal" and control.get("on_timeout") else None)
        if approval is not None:
            try:  # the source's decision is followed only as it was signed
                check_decision(self.evidence.keys, approval)
            except IntegrityViolation as exc:
                self.control.park(ParkReason.INTEGRITY, exc)
                return None
        resumed = resume_after_wait(control, seq, approval, signal is not None, timed_out)
        if isinstance(resumed, Divergence):
            divergence = replace(resumed, step=self.step, seq=self.seq)
            report = divergence.report(self.launch.parent_run_id, source)
            self.control.diverge(DivergeFor(divergence, report))
            return None
        if approval is not None:
            control["approval_id"] = str(approval["id"])  # ctx.decision reads the parent's
        return replace(advance, next_step=resumed, wait=Wait(
            waiting_on=f"replayed:{control.get('kind')}", control=control,
            due_at=self.clock.now()))


SHOWN_REQUEST_BYTES = 64 * 1024


def _shown(request: Any) -> Any:
    """A replay's request as its divergence report keeps it (docs/corpus.md): whole up to
    64 KiB, otherwise only its size (the hash is beside it)."""
    try:
        size = len(canonical_json(request))
    except InvalidInput:
        return None
    return request if size <= SHOWN_REQUEST_BYTES else {"$omitted_bytes": size}


def _error(exc: BaseException) -> dict[str, Any]:
    message = credentials.redact(str(exc))[:2000].replace("\x00", "\\0")  # no NUL in PG
    error: dict[str, Any] = {"type": type(exc).__name__, "message": message}
    status_code = getattr(exc, "status_code", None)
    if status_code is not None:
        error["status_code"] = status_code
    return error


@contextmanager
def overrun_guard(after_s: float, on_overrun: Callable[[], None]) -> Iterator[None]:
    """Run ``on_overrun`` once, on a timer thread, if the block is still running
    ``after_s`` seconds after it began; never once it has ended."""
    def fire() -> None:
        try:
            on_overrun()
        except Exception as exc:  # the call goes on either way; say why nothing was marked
            log.error("could not mark a call that overran its time limit", error=str(exc))

    timer = threading.Timer(after_s, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
