"""``test_first_step`` version 1: the first step pays, its effect named by ordinal."""

from __future__ import annotations

from typing import Any

from tasks import StepContext, Workflow
from tests.versions.first_step import Money, pay

first_step = Workflow("test_first_step", version=1, state=Money)


@first_step.step(start=True)
def send(ctx: StepContext, state: Money) -> Any:
    done = ctx.effect(pay, amount=state.amount, to=state.to)
    return ctx.finish(paid=done["id"], version=1)
