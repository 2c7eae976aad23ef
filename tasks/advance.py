"""Turn what a step returned into the next checkpoint (an ``Advance``), or refuse it.

A refusal is an ``OutcomeError``: the executor retries or fails the step with it, and
nothing is written. What the ledger cannot keep (not plain JSON, nested too deeply, over a
size limit) is refused here, before the commit statement.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from ledger.checkpoints import canonical_json
from ledger.exceptions import InvalidInput
from ledger.steps import Advance
from ledger.vocabulary import OutcomeKind
from tasks import credentials
from tasks.exceptions import OutcomeError
from tasks.outcomes import AskApproval, Fail, Finish, Goto, Sleep, WaitSignal
from tasks.policy import Limits
from tasks.restore import Restored
from tasks.waiting import build_wait
from tasks.workflow import Step, Workflow

__all__ = ["SizeLimits", "next_checkpoint"]


class SizeLimits(Protocol):
    """The limits on what a checkpoint keeps (``ExecutorConfig`` has them)."""

    @property
    def max_state_bytes(self) -> int: ...

    @property
    def max_json_depth(self) -> int: ...

    @property
    def max_approval_artifact_bytes(self) -> int: ...


def next_checkpoint(outcome: object, restored: Restored, *, limits: Limits,
                    sizes: SizeLimits, now: datetime) -> Advance:
    """The checkpoint the step's ``outcome`` commits, or OutcomeError."""
    workflow, step, state = restored.workflow, restored.step, restored.state
    defaults = limits.defaults_for_run()
    if isinstance(outcome, Goto):
        target = _target(workflow, step, outcome.step)
        new_state = _merge(workflow, state, outcome.update, sizes)
        return Advance(step.name, OutcomeKind.GOTO, target.name, new_state, workflow.version,
                       workflow.attempts_for(target), defaults=defaults,
                       state_schema_version=workflow.state_schema_version)
    if isinstance(outcome, (AskApproval, WaitSignal, Sleep)):
        then = _target(workflow, step, outcome.then)
        for other in _continuations(outcome):
            _target(workflow, step, other)
        if isinstance(outcome, AskApproval):
            _check_json(outcome.artifact, "approval artifact", sizes.max_json_depth,
                        sizes.max_approval_artifact_bytes, "ONWARD_MAX_APPROVAL_ARTIFACT_BYTES")
        new_state = _merge(workflow, state, outcome.update, sizes)
        return Advance(step.name, OutcomeKind.WAIT, then.name, new_state, workflow.version,
                       workflow.attempts_for(then), wait=build_wait(outcome, workflow, step, now),
                       defaults=defaults, state_schema_version=workflow.state_schema_version)
    state_json = _as_json(state, sizes)
    if isinstance(outcome, Finish):
        _check_json(outcome.result, "finish result", sizes.max_json_depth,
                    sizes.max_state_bytes)
        return Advance(step.name, OutcomeKind.FINISH, None, state_json, workflow.version, 1,
                       result=outcome.result, defaults=defaults,
                       state_schema_version=workflow.state_schema_version)
    if isinstance(outcome, Fail):
        result = {"reason": outcome.reason, **outcome.details}
        _check_json(result, "fail details", sizes.max_json_depth, sizes.max_state_bytes)
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
           sizes: SizeLimits) -> dict[str, Any]:
    unknown = set(update) - set(type(state).model_fields)
    if unknown:
        raise OutcomeError(f"state update names fields {sorted(unknown)} that "
                           f"{type(state).__name__} does not have")
    try:
        merged = workflow.state.model_validate({**state.model_dump(), **update})
    except ValidationError as exc:
        raise OutcomeError(f"state update is invalid for {type(state).__name__}: {exc}") from exc
    return _as_json(merged, sizes)


def _as_json(state: BaseModel, sizes: SizeLimits) -> dict[str, Any]:
    try:
        data = state.model_dump(mode="json")
    except Exception as exc:
        raise OutcomeError(f"state is not JSON-serializable: {exc}") from exc
    _check_json(data, "state", sizes.max_json_depth, sizes.max_state_bytes)
    return data


def _check_json(value: Any, what: str, max_depth: int, max_bytes: int,
                setting: str = "ONWARD_MAX_STATE_BYTES") -> None:
    """Refuse (OutcomeError) what the ledger cannot keep: not plain JSON, a NUL character,
    nested deeper than ``max_depth``, larger than ``max_bytes``."""
    try:
        body = canonical_json(value, max_depth=max_depth)
    except InvalidInput as exc:
        raise OutcomeError(f"{what} cannot be stored: {exc}") from exc
    if credentials.held_in(body):
        raise OutcomeError(f"{what} holds the value of a tool credential: keep credentials out "
                           "of states and results; a tool resolves secret://NAME when it calls "
                           "(docs/security.md)")
    size = len(body)
    if size > max_bytes:
        raise OutcomeError(f"{what} is {size} bytes, over the limit of {max_bytes} ({setting}); "
                           "keep large values out of the ledger and pass references")
