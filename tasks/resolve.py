"""Before a run ends, learn the outcome of its effects (docs/effects.md, "When a run ends").

Every path that ends or refuses a run (a budget, the deadline, an expired approval, a
blocked or unsimulated effect, a non-retryable error, the last retry, a cancel) first asks
the provider about each effect whose outcome is unknown: a pending effect that was sent is
looked up by its key (found: recorded as the provider has it; missing: the call never
landed), an accepted one is polled once. What stays unknown makes the caller park the run
(``effect_outcome_unknown``) instead of ending it; the statement that ends the run refuses
to if an unknown outcome remains, so a race cannot close one either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ledger.effects import Effect, EffectStore
from ledger.vocabulary import EffectAttemptKind, EffectAttemptOutcome, EffectStatus
from tasks.tools import Tool, ToolResult, invoke

__all__ = ["Resolver"]


_STATUS = {
    EffectAttemptOutcome.COMPLETED: EffectStatus.COMPLETED,
    EffectAttemptOutcome.ACCEPTED: EffectStatus.ACCEPTED,
    EffectAttemptOutcome.FAILED: EffectStatus.FAILED,
}


@dataclass(frozen=True)
class Resolver:
    """Asks the provider, under the caller's lease, what became of a run's effects."""

    effects: EffectStore
    tools: Callable[[str], Tool | None]
    worker: str
    epoch: int
    timeout_s: float  # a call's time limit when its tool sets none
    margin_s: float
    simulation: bool = False  # the run's effects went to sandboxes, never to a provider

    def first_unknown(self, run_id: Any) -> Effect | None:
        """Try each effect of the run whose outcome is unknown; return the first one that
        stays unknown (the run must be parked), or None (the run may end)."""
        for effect in self.effects.unresolved(run_id):
            if not self._settle(effect):
                return effect
        return None

    def _settle(self, effect: Effect) -> bool:
        if self.simulation:
            return self._sandboxed(effect)
        tool = self.tools(effect.effect_type)
        if tool is None:
            return False
        if effect.status is EffectStatus.ACCEPTED:
            return self._poll(tool, effect)
        return self._lookup(tool, effect)

    def _begin(self, tool: Tool | None, effect: Effect, kind: EffectAttemptKind) -> int:
        timeout = tool.timeout_for(self.timeout_s) if tool else self.timeout_s
        return self.effects.begin_attempt(effect, kind, worker=self.worker, epoch=self.epoch,
                                          cover_s=timeout + self.margin_s)

    def _sandboxed(self, effect: Effect) -> bool:
        """A simulation's effect never reached a real provider: close it as not landed."""
        attempt = self._begin(None, effect, EffectAttemptKind.LOOKUP)
        self.effects.record(effect, attempt, outcome=EffectAttemptOutcome.MISSING,
                            status=EffectStatus.PENDING,
                            error={"message": "simulation: only the sandbox was called"},
                            epoch=self.epoch)
        return True

    def _lookup(self, tool: Tool, effect: Effect) -> bool:
        if tool.lookup is None or effect.call_overran:
            return False  # no lookup; or a call overran its time limit and may still land
        attempt = self._begin(tool, effect, EffectAttemptKind.LOOKUP)
        try:
            found = invoke(tool.lookup, effect.effect_id,
                           timeout=tool.timeout_for(self.timeout_s))
        except Exception as exc:
            self.effects.record(effect, attempt, outcome=EffectAttemptOutcome.UNKNOWN,
                                status=effect.status, error=_error(exc), epoch=self.epoch)
            return False
        if found is None:
            self.effects.record(effect, attempt, outcome=EffectAttemptOutcome.MISSING,
                                status=EffectStatus.PENDING, epoch=self.epoch)
            return True
        return self._record(effect, attempt, ToolResult.coerce(found), reconciled=True)

    def _poll(self, tool: Tool, effect: Effect) -> bool:
        if tool.status is None or effect.provider_ref is None:
            return False
        attempt = self._begin(tool, effect, EffectAttemptKind.STATUS)
        try:
            answer = ToolResult.coerce(invoke(tool.status, effect.provider_ref,
                                              timeout=tool.timeout_for(self.timeout_s)))
        except Exception as exc:
            self.effects.record(effect, attempt, outcome=EffectAttemptOutcome.UNKNOWN,
                                status=EffectStatus.ACCEPTED, error=_error(exc), poll=True,
                                epoch=self.epoch)
            return False
        return self._record(effect, attempt, answer, reconciled=False, poll=True)

    def _record(self, effect: Effect, attempt: int, answer: ToolResult, *, reconciled: bool,
                poll: bool = False) -> bool:
        status = _STATUS[answer.outcome]
        done = self.effects.record(
            effect, attempt,
            outcome=EffectAttemptOutcome.FOUND if reconciled else answer.outcome, status=status,
            provider_ref=answer.provider_ref,
            result=answer.result if status is EffectStatus.COMPLETED else None,
            error={"provider": answer.result} if status is EffectStatus.FAILED else None,
            reconciled=reconciled, poll=poll, epoch=self.epoch)
        return done.status is not EffectStatus.ACCEPTED


def _error(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc)[:2000]}
