"""The worker-side half of operator commands: the tools and state models that live in the
workflow modules (``ONWARD_WORKFLOWS``), which the ledger must not import.

* ``plan_repeat`` / ``repeat_effect``: the privileged re-send of one external effect
  (docs/design.md section 8). The ledger records the attempt, with a new key of its own, and
  commits it before the tool is called; the provider's answer is recorded on that attempt.
* ``state_check``: validates a branch's patched state against the workflow's model before
  the branch is created, so an invalid edit is refused instead of parked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ledger import signed
from ledger.api import Ledger
from ledger.checkpoints import canonical_json, sha256_hex
from ledger.effects import Effect, EffectAttempt, opened_effect
from ledger.exceptions import IntegrityViolation, InvalidInput, OperationRefused
from ledger.forks import StateCheck
from ledger.operations import RepeatStarted
from ledger.vocabulary import AuditAction, EffectAttemptOutcome, LaunchMode
from tasks import credentials
from tasks.exceptions import ToolError
from tasks.tools import Tool, ToolResult, invoke
from tasks.workflow import Registry
from tasks.workflow_modules import import_workflow_module

__all__ = [
    "RepeatOutcome",
    "RepeatPlan",
    "check_repeat",
    "dedup_method",
    "find_tool",
    "plan_repeat",
    "repeat_effect",
    "state_check",
]


def find_tool(modules: list[str], name: str) -> Tool | None:
    """The Tool named ``name`` among the module attributes of the workflow modules."""
    for module_name in modules:
        module = import_workflow_module(module_name)  # one clear error, not a traceback
        for value in vars(module).values():
            if isinstance(value, Tool) and value.name == name:
                return value
    return None


def dedup_method(tool: Tool | None) -> str:
    """How duplicates of this tool's effects are avoided when an outcome is unknown."""
    if tool is None:
        return "unknown (the tool is not in ONWARD_WORKFLOWS)"
    if tool.lookup is not None:
        return "lookup"
    if tool.honours_key:
        return "provider idempotency key"
    return "none"


@dataclass(frozen=True)
class RepeatPlan:
    """What a repeat will do, shown before it is confirmed. Confirming it carries the
    effect's attempt count as shown: the ledger refuses if the effect changed since (another
    admin repeated it meanwhile), so two confirmations of one plan make one repeat."""

    effect: Effect
    attempts: list[EffectAttempt]
    dedup: str
    tool: Tool | None = field(repr=False)
    run_mode: str = "original"  # the run's mode: original, evidence, simulation, live, branch

    @property
    def latest(self) -> EffectAttempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def sends_to(self) -> str:
        """Where the repeat goes: a simulation's effect only ever goes to the sandbox."""
        if self.run_mode == LaunchMode.EVIDENCE.value:
            return "nowhere (an evidence replay calls nothing; repeat the parent's effect)"
        if self.run_mode == LaunchMode.SIMULATION.value:
            return "sandbox"
        return "provider"

    def as_dict(self) -> dict[str, Any]:
        latest = self.latest
        return {
            "effect_type": self.effect.effect_type, "effect_id": self.effect.effect_id,
            "run_id": str(self.effect.run_id), "seq": self.effect.seq,
            "command_id": self.effect.command_id, "recipient": self.effect.recipient,
            "payload": self.effect.payload, "status": self.effect.status.value,
            "provider_ref": self.effect.provider_ref,
            "latest_attempt": ({"attempt": latest.attempt, "kind": latest.kind,
                                "outcome": latest.outcome, "key": latest.idempotency_key}
                               if latest else None),
            "dedup": self.dedup, "attempts": self.effect.attempts,
            "run_mode": self.run_mode, "sends_to": self.sends_to,
        }


def plan_repeat(ledger: Ledger, effect: Effect) -> RepeatPlan:
    tool = find_tool(ledger.settings.workflows, effect.effect_type)
    run = ledger.get_run(effect.run_id)
    return RepeatPlan(effect, ledger.effect_attempts(effect), dedup_method(tool), tool,
                      run_mode=(run.mode if run else None) or "original")


@dataclass(frozen=True)
class RepeatOutcome:
    started: RepeatStarted
    outcome: EffectAttemptOutcome  # completed, accepted, failed or unknown
    provider_ref: str | None
    effect: Effect
    error: dict[str, Any] | None = None


def repeat_effect(ledger: Ledger, plan: RepeatPlan, reason: str | None, *,
                  shown_attempts: int | None = None) -> RepeatOutcome:
    """Call the tool again with a new recorded key (kind ``repeat``), never blindly hidden in
    a replay or continue. Needs the admin role; the attempt is committed before the call.

    ``shown_attempts`` is the effect's attempt count as the person confirming saw it (a web
    form, an API client); by default the plan's. The ledger refuses if it changed since."""
    call, payload, shown = _ready_to_repeat(ledger, plan, reason, shown_attempts)
    started = ledger.begin_repeat(plan.effect.effect_type, plan.effect.effect_id, reason,
                                  shown)
    error: dict[str, Any] | None = None
    outcome: EffectAttemptOutcome
    ref: str | None = None
    result: dict[str, Any] | None = None
    try:
        answer = ToolResult.coerce(invoke(call, payload, started.idempotency_key,
                                          timeout=_timeout(ledger, plan)))
        outcome = answer.outcome
        ref, result = answer.provider_ref, answer.result
    except ToolError as exc:
        outcome = EffectAttemptOutcome.FAILED
        error = {"type": type(exc).__name__, "message": credentials.redact(str(exc))[:2000],
                 "status_code": exc.status_code}
    except Exception as exc:
        outcome = EffectAttemptOutcome.UNKNOWN
        error = {"type": type(exc).__name__, "message": credentials.redact(str(exc))[:2000]}
    effect = ledger.finish_repeat(started, outcome=outcome, provider_ref=ref, result=result,
                                  error=error)
    return RepeatOutcome(started, outcome, ref, effect, error)


def check_repeat(ledger: Ledger, plan: RepeatPlan, reason: str | None) -> None:
    """Raise (audited) the refusal ``repeat_effect`` would give now, calling nothing and
    recording nothing: a command asks this before it asks the person. ``repeat_effect``
    checks again, the ledger under the effect's lock, and decides."""
    _, _, shown = _ready_to_repeat(ledger, plan, reason, None)
    ledger.begin_repeat(plan.effect.effect_type, plan.effect.effect_id, reason, shown,
                        dry_run=True)


def _ready_to_repeat(ledger: Ledger, plan: RepeatPlan, reason: str | None,
                     shown_attempts: int | None
                     ) -> tuple[Callable[..., Any], dict[str, Any], dict[str, Any]]:
    """What a repeat calls, the payload it sends and the plan the ledger checks it against,
    or a refusal (audited): the role, no tool or sandbox to call, a payload that does not
    open here."""
    effect = plan.effect
    ledger.require(AuditAction.REPEAT_EFFECT, run_id=effect.run_id, effect_id=effect.effect_id)
    call = _repeat_call(plan)
    if isinstance(call, OperationRefused):
        raise ledger.refuse(AuditAction.REPEAT_EFFECT, call, reason=reason,
                            run_id=effect.run_id, effect_id=effect.effect_id)
    # a sealed payload is opened here (the repeating process holds the keys) or refused,
    # before the attempt is recorded
    payload = _repeat_payload(ledger, effect)
    if isinstance(payload, OperationRefused):
        raise ledger.refuse(AuditAction.REPEAT_EFFECT, payload, reason=reason,
                            run_id=effect.run_id, effect_id=effect.effect_id)
    shown = plan.as_dict()
    if shown_attempts is not None:
        shown["attempts"] = shown_attempts
    return call, payload, shown


def _repeat_payload(ledger: Ledger, effect: Effect) -> dict[str, Any] | OperationRefused:
    """The payload a repeat sends: opened (a plan made through ``Ledger`` shows it opened
    already), or why it cannot be: it does not open, or it reads ``***`` (a reader who may
    not see it; its tenant's keys erased, ``*** (unreadable)``), or it is not what the step
    asked for: the request's MAC does not verify, or the payload does not hash to it."""
    try:  # the request (shown opened, so its outcome's MAC over the stored result is not
        # checked here: a repeat does not send the result)
        ledger.keys.check(signed.effect_intent(vars(effect)), effect.intent_mac,
                          f"effect {effect.effect_type} {effect.effect_id[:16]}…'s request")
    except IntegrityViolation as exc:
        return OperationRefused(f"{exc}: nothing was repeated")
    try:
        payload = opened_effect(ledger.keys, effect).payload
    except IntegrityViolation as exc:
        return OperationRefused(f"effect {effect.effect_id[:16]}…: its payload does not open "
                                f"({exc}): nothing was repeated")
    if isinstance(payload, dict) and sha256_hex(canonical_json(payload)) != effect.request_hash:
        return OperationRefused(f"effect {effect.effect_id[:16]}…: its stored payload is not "
                                "what its signed request hash names (edited outside onward): "
                                "nothing was repeated")
    if payload is not None and not isinstance(payload, dict):
        return OperationRefused(f"effect {effect.effect_id[:16]}…: its payload reads "
                                f"{str(payload)[:40]!r} here (sealed, and its tenant's keys "
                                "erased or not configured in this process): nothing was "
                                "repeated")
    return dict(payload or {})


def _repeat_call(plan: RepeatPlan) -> Callable[..., Any] | OperationRefused:
    """What a repeat calls: the tool's real call for a run that calls for real, its sandbox
    for a simulation's effect, nothing for an evidence replay's."""
    effect = plan.effect
    if plan.tool is None:
        return OperationRefused(f"no tool {effect.effect_type!r} in the workflow modules "
                                "(set ONWARD_WORKFLOWS)")
    if plan.run_mode == LaunchMode.EVIDENCE.value:
        return OperationRefused(f"effect {effect.effect_id[:16]}… belongs to an evidence "
                                "replay, which never calls a provider: repeat the parent "
                                "run's effect instead")
    if plan.run_mode == LaunchMode.SIMULATION.value:
        if plan.tool.simulate is None:
            return OperationRefused(f"effect {effect.effect_id[:16]}… belongs to a "
                                    f"simulation and {effect.effect_type} has no simulate: "
                                    "a simulation's effect never reaches the real provider")
        return plan.tool.simulate
    return plan.tool.call


def _timeout(ledger: Ledger, plan: RepeatPlan) -> float:
    default = ledger.settings.tool_timeout_s
    return plan.tool.timeout_for(default) if plan.tool is not None else default


def state_check(modules: list[str]) -> StateCheck | None:
    """A validator of branch states against the workflows' models (None without modules)."""
    if not modules:
        return None
    for module in modules:
        import_workflow_module(module)  # one clear error, not a traceback
    registry = Registry()
    registry.load_modules(modules)  # imported above: registers what they define

    def check(workflow_name: str, version: int | None, state: dict[str, Any]) -> None:
        workflow = registry.get(workflow_name, version) or registry.get(workflow_name)
        if workflow is None:
            return  # not loaded here: the worker validates it on restore (and parks)
        try:
            workflow.state.model_validate(state)
        except ValidationError as exc:
            raise InvalidInput(f"the patched state is not a valid {workflow.state.__name__}: "
                               f"{exc}") from exc

    return check
