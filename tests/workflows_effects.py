"""Workflows for the effect crash tests (imported by workers via ONWARD_WORKFLOWS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from examples.provider_client import provider_tool
from ledger.vocabulary import ToolClass
from tasks import StepContext, Workflow
from tasks.retry import RetryPolicy

unstable_payload = provider_tool("test.unstable", "unstable", ToolClass.IRREVERSIBLE)
no_lookup = provider_tool("test.no_lookup", "blind", ToolClass.IRREVERSIBLE, lookup=False)
# every retry left to the step (no retry policy of its own): the tests count step attempts
poisoned = provider_tool("test.poisoned", "poisoned", ToolClass.IDEMPOTENT_WRITE,
                         retry=RetryPolicy(attempts=1))
chained = provider_tool("test.chained", "chained", ToolClass.IRREVERSIBLE)


class Empty(BaseModel):
    pass


conflict = Workflow("test_effect_conflict", version=1, state=Empty)


@conflict.step(start=True)
def send_changing(ctx: StepContext, state: Empty) -> Any:
    """A step whose payload differs between attempts: the key must not permit it."""
    ctx.effect(unstable_payload, amount=100 * ctx.attempt)
    return ctx.finish()


blind = Workflow("test_effect_no_lookup", version=1, state=Empty)


@blind.step(start=True)
def send_blind(ctx: StepContext, state: Empty) -> Any:
    ctx.effect(no_lookup, note="no lookup, no provider dedupe")
    return ctx.finish()


poison = Workflow("test_effect_poison", version=1, state=Empty, max_attempts=3)


@poison.step(start=True)
def send_poison(ctx: StepContext, state: Empty) -> Any:
    ctx.effect(poisoned, note="the provider always fails")
    return ctx.finish()


class Chain(BaseModel):
    steps: int = 5
    done: int = 0


effect_chain = Workflow("test_effect_chain", version=1, state=Chain)


@effect_chain.step(start=True)
def act(ctx: StepContext, state: Chain) -> Any:
    """One irreversible effect per step: the chaos benchmark's unit of work."""
    ctx.effect(chained, n=state.done, run=str(ctx.run_id))
    done = state.done + 1
    if done >= state.steps:
        return ctx.finish(done=done)
    return ctx.goto(act, done=done)


orphaned = provider_tool("test.orphaned", "orphaned", ToolClass.IRREVERSIBLE)
orphaned_blind = provider_tool("test.orphaned_blind", "orphaned_blind", ToolClass.IRREVERSIBLE,
                               lookup=False)


class Orphan(BaseModel):
    marker: str  # a file: absent, the step sends (and creates it); present, it does not
    blind: bool = False  # send through a tool with no lookup
    finish: bool = False  # the step ends the run rather than going on to after_send
    sent: bool = False


orphan = Workflow("test_effect_orphan", version=1, state=Orphan)


@orphan.step(start=True)
def maybe_send(ctx: StepContext, state: Orphan) -> Any:
    """A step whose body is not deterministic: its first attempt sends, a retry (the
    marker file is there by then) takes another path and never makes that call."""
    marker = Path(state.marker)
    sent = not marker.exists()
    if sent:
        marker.write_text("sent once")
        ctx.effect(orphaned_blind if state.blind else orphaned, note="made by attempt 1 only")
    return ctx.finish(sent=sent) if state.finish else ctx.goto(after_send, sent=sent)


@orphan.step()
def after_send(ctx: StepContext, state: Orphan) -> Any:
    return ctx.finish()
