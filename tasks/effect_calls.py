"""``ctx.effect`` (docs/effects.md): an intent recorded before the call, the call made once
under the effect's idempotency key, an outcome nobody knows reconciled by lookup before
anything is sent again, an accepted job polled, and what the step must not swallow (a
wait, a park) recorded on ``Control`` before anything is raised."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from ledger.checkpoints import canonical_json, sha256_hex
from ledger.effects import Effect, Intent
from ledger.exceptions import CancelRequested, EffectConflict, EffectFenced, InvalidInput
from ledger.vocabulary import (
    EffectAttemptKind,
    EffectAttemptOutcome,
    EffectStatus,
    ParkReason,
    ToolClass,
)
from tasks import credentials, faults
from tasks.call_limits import CallLimits
from tasks.control import Suspend, WaitFor
from tasks.exceptions import EffectFailed, EffectOutcomeUnknown, OutcomeError, ToolError
from tasks.replay_answers import ReplayAnswers
from tasks.scope import call_error, effect_id_for, log
from tasks.tools import Tool, ToolResult, invoke

__all__ = ["EffectCalls", "overrun_guard", "poll_delay"]


def poll_delay(polls: int) -> float:
    return min(30.0, 0.25 * 2.0 ** min(polls, 10))


class EffectCalls(CallLimits, ReplayAnswers):
    """External effects of one step."""

    def effect(self, tool: Tool, key: str | None, payload: dict[str, Any],
               position: int | None = None) -> dict[str, Any]:
        self.tools_used[tool.name] = tool
        self._claim_covers_until = None  # an outside call: later ones ask the ledger first
        try:
            result = self._effect(tool, key, payload, position)
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

    def _effect(self, tool: Tool, key: str | None, payload: dict[str, Any],
                position: int | None) -> dict[str, Any]:
        if tool.tool_class is ToolClass.READ:
            raise OutcomeError(f"tool {tool.name} is a read: use ctx.read, not ctx.effect")
        command_id = self.command_id(key, position)
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
                f"{request_hash[:12]}…); a key must not change its request"
                f"{self.position_note(command_id)}")
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
        # left unfinished by an earlier attempt: its attempts decide between a lookup and a
        # resend, so they must be the ones onward recorded (an edit could make a call that
        # landed look refused, or never made, and have it sent twice)
        self._verified(lambda: self.effects.check_attempts(effect))
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
                                status=effect.status, error=call_error(exc))
            self.unknown[effect.effect_id] = tool.name
            raise EffectOutcomeUnknown(f"lookup of {tool.name} failed: {exc}") from exc
        if found is None:  # the earlier call never landed: send again, same key
            self._record_effect(effect, attempt, outcome=EffectAttemptOutcome.MISSING,
                                status=EffectStatus.PENDING)
            return self._send(tool, replace(effect, call_unknown=False), payload)
        return self._apply(tool, effect, attempt, ToolResult.coerce(found), reconciled=True)

    def _begin(self, tool: Tool, effect: Effect, kind: EffectAttemptKind) -> int:
        """Record the attempt and extend the lease over the call's time limit (one statement)."""
        return self.effects.begin_attempt(effect, kind, worker=self.worker, epoch=self.epoch,
                                          cover_s=self.timeout(tool) + self.lease_margin_s)

    def _record_effect(self, effect: Effect, attempt: int, **outcome: Any) -> Effect:
        recorded = self.effects.record(effect, attempt, epoch=self.epoch, **outcome)
        if recorded.status is not EffectStatus.PENDING:
            self.unknown.pop(effect.effect_id, None)
        return recorded

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
                                    status=EffectStatus.PENDING, error=call_error(exc))
                if effect.outcome_unknown:
                    self.unknown[effect.effect_id] = tool.name
                self._retry_later(tool.retry_policy, effect.command_id, exc, tool.name)
                raise EffectOutcomeUnknown(f"{tool.name} refused for now: {exc}") from exc
            failed = self._record_effect(effect, attempt, outcome=EffectAttemptOutcome.FAILED,
                                  status=EffectStatus.FAILED, error=call_error(exc))
            raise EffectFailed(f"{tool.name} refused: {exc}", failed) from exc
        except Exception as exc:
            self._record_effect(effect, attempt, outcome=EffectAttemptOutcome.UNKNOWN,
                                status=EffectStatus.PENDING, error=call_error(exc))
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
                                  status=EffectStatus.ACCEPTED, error=call_error(exc), poll=True)
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
