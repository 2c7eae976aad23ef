"""Run a step's body, plain or ``async def``, held to its ``timeout`` (tasks/deadline.py,
tasks/aio.py). The executor calls ``run_step_body`` where it would call the step."""

from __future__ import annotations

from typing import Any

from ledger.exceptions import EffectFenced, EvidenceFenced
from tasks import aio, deadline
from tasks.context import AsyncStepContext, BaseContext
from tasks.deadline import StepDeadline
from tasks.exceptions import LeaseLost, StepError, StepTimedOut
from tasks.workflow import Step

__all__ = ["run_step_body"]


def run_step_body(step: Step, ctx: BaseContext, state: Any) -> Any:
    """What the body returns. Past the step's timeout it is interrupted where the pool
    allows; what it returns late is refused, and an error it raises late that would be
    retried anyway is recorded as ``StepTimedOut`` (a definitive failure and a lost lease
    stand)."""
    if step.timeout_s is None:
        if step.is_async:
            return aio.run(step(AsyncStepContext.of(ctx), state), None)
        return step(ctx, state)
    limit = StepDeadline(step.name, step.timeout_s)
    try:
        with deadline.in_force(limit):
            if step.is_async:
                outcome = aio.run(step(AsyncStepContext.of(ctx), state), limit)
            else:
                with deadline.interrupting(limit):
                    outcome = step(ctx, state)
    except (LeaseLost, EffectFenced, EvidenceFenced):
        raise
    except Exception as exc:
        final = isinstance(exc, StepError) and exc.non_retryable
        if limit.passed and not final and not isinstance(exc, StepTimedOut):
            raise limit.error() from exc
        raise
    if limit.passed:
        raise limit.error()
    return outcome
