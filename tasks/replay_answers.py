"""Where a replay's or a branch's answers come from (docs/design.md section 8), by the run's
``Launch``: an **evidence** replay answers every call from its parent's records by
``command_id`` and calls nothing (a call without a matching record stops it as
``diverged``) and follows the decisions its source recorded for its waits; a
**simulation** refuses a tool without ``simulate``; a **live** replay or a **branch**
refuses irreversible effects unless explicitly allowed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from uuid import UUID

from ledger.checkpoints import canonical_json
from ledger.exceptions import IntegrityViolation, InvalidInput
from ledger.lineage import Divergence, resume_after_wait
from ledger.steps import Advance, Wait
from ledger.vocabulary import (
    EffectStatus,
    EvidenceKind,
    FailReason,
    ParkReason,
    ToolClass,
    WaitKind,
)
from ledger.wait_control import ApprovalControl, SignalControl
from ledger.waits import check_decision
from tasks.control import DivergeFor, FailFor, Suspend
from tasks.exceptions import EffectFailed
from tasks.scope import StepScope, effect_id_for
from tasks.tools import Tool

__all__ = ["SHOWN_REQUEST_BYTES", "ReplayAnswers", "shown_request"]


SHOWN_REQUEST_BYTES = 64 * 1024


def shown_request(request: Any) -> Any:
    """A replay's request as its divergence report keeps it (docs/corpus.md): whole up to
    64 KiB, otherwise only its size (the hash is beside it)."""
    try:
        size = len(canonical_json(request))
    except InvalidInput:
        return None
    return request if size <= SHOWN_REQUEST_BYTES else {"$omitted_bytes": size}


class ReplayAnswers(StepScope):
    """A replay's or a branch's answers and refusals."""

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
                                request_hash=request_hash, request=shown_request(request))
        if found.kind != kind.value or found.request_hash != request_hash:
            raise self._diverge(
                kind.value, "request_differs", command_id,
                f"step {self.step} at seq {self.seq}: {kind.value} call {command_id} asks "
                f"for something else than the parent recorded (request hash "
                f"{request_hash[:12]}…, recorded {found.request_hash[:12]}… as "
                f"{found.kind} from {found.source})",
                request_hash=request_hash, recorded_request_hash=found.request_hash,
                request=shown_request(request))
        return dict(found.response)

    def _recorded_effect(self, tool: Tool, command_id: str, request_hash: str,
                         payload: dict[str, Any]) -> dict[str, Any]:
        source = self._evidence_source()
        recorded = (self.lineage.effect(tool.name, effect_id_for(source, tool.name, command_id))
                    if source is not None else None)
        if recorded is not None:
            found = recorded
            recorded = self._verified(lambda: self.effects.check(found))
        shown = shown_request(payload) if tool.store_payload else None
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
        control = wait.control
        seq = self.seq + 1
        try:
            source = self._evidence_source()
        except IntegrityViolation:  # an ancestor's launch was edited: parked
            return None
        approval = (self.lineage.approval_at(source, seq)
                    if source is not None and isinstance(control, ApprovalControl) else None)
        signal = (self.lineage.signal_at(source, control.name, seq)
                  if source is not None and isinstance(control, SignalControl) else None)
        timed_out = (self.lineage.step_after(source, seq) if source is not None and signal is None
                     and isinstance(control, SignalControl) and control.on_timeout else None)
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
        if approval is not None:  # ctx.decision reads the parent's
            control = control.model_copy(update={"approval_id": str(approval["id"])})
        return replace(advance, next_step=resumed, wait=Wait(
            waiting_on=f"{WaitKind.REPLAYED.value}:{control.kind}", control=control,
            due_at=self.clock.now()))
