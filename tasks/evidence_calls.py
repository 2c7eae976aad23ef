"""``ctx.llm`` and ``ctx.read`` (docs/effects.md, "Evidence"): a call recorded once, by
``command_id``, and its recorded answer given back to every re-execution; an answer the
ledger cannot record is debited and refused, once. Also what ended the step's wait
(``ctx.decision``, ``ctx.signal``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ledger.evidence import Evidence, EvidenceRecord, Refusal
from ledger.exceptions import (
    CancelRequested,
    EffectConflict,
    EvidenceFenced,
    IntegrityViolation,
    InvalidInput,
    MalformedControl,
)
from ledger.vocabulary import EvidenceKind, FailReason, ParkReason, ToolClass
from ledger.wait_control import ApprovalControl, parse_control
from ledger.waits import check_signal, opened_signal
from tasks import faults
from tasks.call_limits import CallLimits
from tasks.control import FailFor, Suspend
from tasks.exceptions import OutcomeError, StepError
from tasks.llm import LLMResponse, StreamTo, call_model
from tasks.replay_answers import ReplayAnswers
from tasks.scope import request_hash_of
from tasks.tools import Tool, ToolResult, invoke

__all__ = ["EvidenceCalls"]


class EvidenceCalls(CallLimits, ReplayAnswers):
    """Model calls and reads of one step."""

    def llm(self, *, model: str, messages: list[dict[str, Any]], key: str | None,
            params: dict[str, Any], position: int | None = None) -> LLMResponse:
        request_hash = request_hash_of({"model": model, "messages": messages, "params": params})
        try:
            response = self._llm(model, messages, key, params, request_hash, position)
        except CancelRequested as exc:
            raise self.cancelled(exc) from exc
        self._evidence_refs.append({"kind": EvidenceKind.LLM.value,
                                    "command_id": self._last_command,
                                    "request_hash": request_hash})
        return response

    def _llm(self, model: str, messages: list[dict[str, Any]], key: str | None,
             params: dict[str, Any], request_hash: str, position: int | None) -> LLMResponse:
        command_id = self.command_id(key, position)
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
        kept = self._kept(EvidenceRecord(
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
        try:  # a control this code cannot read parked the run before its step started
            control = parse_control(self.checkpoint_control)
        except MalformedControl:
            return None
        if not isinstance(control, ApprovalControl):
            return None
        return self.waits.approval(control.approval_id)

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
        return self._verified(lambda: opened_signal(self.evidence.keys, found, self.tenant_id))

    def read(self, tool: Tool, key: str | None, params: dict[str, Any],
             position: int | None = None) -> dict[str, Any]:
        if tool.tool_class is not ToolClass.READ:
            raise OutcomeError(f"tool {tool.name} is {tool.tool_class.value}: use ctx.effect")
        request_hash = request_hash_of(params)
        try:
            result = self._read(tool, key, params, request_hash, position)
        except CancelRequested as exc:
            raise self.cancelled(exc) from exc
        self._evidence_refs.append({"kind": EvidenceKind.READ.value,
                                    "command_id": self._last_command,
                                    "request_hash": request_hash})
        return result

    def _read(self, tool: Tool, key: str | None, params: dict[str, Any],
              request_hash: str, position: int | None) -> dict[str, Any]:
        command_id = self.command_id(key, position)
        if self.launch.evidence:
            return dict(self._parent_record(EvidenceKind.READ, command_id, request_hash,
                                            params)["result"])
        recorded = self._recorded(command_id, request_hash, self.timeout(tool))
        if recorded is not None:
            return dict(recorded["result"])
        answer = ToolResult.coerce(self._limited_call(
            tool.limits, tool.retry_policy, tool.name, command_id, self.timeout(tool),
            lambda: invoke(tool.call, params, command_id, timeout=self.timeout(tool))))
        kept = self._kept(EvidenceRecord(
            run_id=self.run_id, command_id=command_id, kind=EvidenceKind.READ.value,
            seq=self.seq, step=self.step, source=tool.name, source_version=answer.version,
            request_hash=request_hash,
            response={"result": answer.result, "version": answer.version,
                      "read_at": self.clock.now().isoformat()},
            lease_epoch=self.epoch, request=params if tool.store_payload else None,
        ))
        return dict(kept.response["result"])

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
        and reads nothing more), EvidenceFenced once the lease is lost (nothing called).
        The step's first call skips that statement when the claim already covers it
        (``claim_covers``): the claim found no answer at this seq, no cancel, and took a
        lease that still lasts the call's time limit and the margin (a step whose
        ``timeout`` exceeds the call's)."""
        cover_s = timeout_s + self.lease_margin_s
        if self.claim_covers(cover_s):  # nothing recorded at this seq: nothing to look up
            return None
        found = self._find_or_cover(command_id, cover_s)
        if found is None:
            return None
        if isinstance(found, Refusal):  # an earlier attempt's answer could not be recorded
            self._refused(found.kind, found.source, command_id, found.reason, found.tokens,
                          float(found.cost_usd), self.spent)
            raise Suspend()
        self._same_request(found.request_hash, command_id, request_hash)
        return dict(found.response)

    def _same_request(self, recorded_hash: str, command_id: str, request_hash: str) -> None:
        """An answer recorded for ``command_id`` answers this call only if it was asked the
        same request; otherwise the run parks (evidence_conflict)."""
        if recorded_hash != request_hash:
            conflict = EffectConflict(
                f"{command_id} was recorded for a different request (hash "
                f"{recorded_hash[:12]}…, now {request_hash[:12]}…): the step is not "
                f"deterministic up to this call{self.position_note(command_id)}")
            self.control.park(ParkReason.EVIDENCE_CONFLICT, conflict)
            raise conflict

    def _kept(self, record: EvidenceRecord) -> Evidence:
        """``_record``, and the answer that stands for the call: this one, or one an earlier
        attempt recorded first, which a look-up skipped on the claim's word (nothing
        answered at this seq) would have found. That can only be if the claim was wrong
        (ledger/steps.py, ``StepStore._successor_claim``): the call was made again, and the
        first answer is used, checked like a looked-up one (``_same_request``)."""
        kept = self._record(record)
        self._same_request(kept.request_hash, record.command_id, record.request_hash)
        return kept
