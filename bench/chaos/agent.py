"""The workflow the chaos benchmark (``python -m bench.chaos``) runs; workers import it
through ``ONWARD_WORKFLOWS=bench.chaos.agent`` with the repository root on ``PYTHONPATH``.

``chaos_agent``: K steps, each one irreversible write to the reference provider
(examples/provider.py) through a tool that has a lookup by idempotency key. One step of a
few runs (``blind_at``) uses a tool with neither a lookup nor provider-side dedupe; the
benchmark drops that call's response on purpose, so those runs must park for review
(``effect_outcome_unknown``) and are counted as expected parks.

The body of every payload names the run and the step (``{"run", "n"}``), so the provider's
objects can be matched to runs without the ledger; the object ids returned by the effects
are kept in the state and end up in the run's result.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from examples.provider_client import provider_tool
from ledger.vocabulary import ToolClass
from tasks import StepContext, Workflow

WORKFLOW = "chaos_agent"
COLLECTION = "chaos"
BLIND_COLLECTION = "chaos_blind"
MAX_ATTEMPTS = 12  # per step: crashes, dropped responses and 500s all spend attempts

write = provider_tool("chaos.write", COLLECTION, ToolClass.IRREVERSIBLE)
blind_write = provider_tool("chaos.blind_write", BLIND_COLLECTION, ToolClass.IRREVERSIBLE,
                            lookup=False)


class ChaosState(BaseModel):
    steps: int = 5
    done: int = 0
    blind_at: int = -1  # the step (0-based) that uses the tool without lookup; -1: none
    pause_ms: int = 0  # time spent in the step around the effect (so kills land mid-step)
    refs: list[str] = Field(default_factory=list)


chaos_agent = Workflow(WORKFLOW, version=1, state=ChaosState, max_attempts=MAX_ATTEMPTS)


def _pause(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000.0)


@chaos_agent.step(start=True)
def act(ctx: StepContext, state: ChaosState) -> Any:
    """One irreversible effect per step, with some work before and after it."""
    _pause(state.pause_ms / 2)
    tool = blind_write if state.done == state.blind_at else write
    created = ctx.effect(tool, n=state.done, run=str(ctx.run_id))
    _pause(state.pause_ms / 2)
    done = state.done + 1
    refs = [*state.refs, str(created.get("id"))]
    if done >= state.steps:
        return ctx.finish(done=done, refs=refs)
    return ctx.goto(act, done=done, refs=refs)
