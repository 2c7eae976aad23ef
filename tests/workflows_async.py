"""Workflows for async steps and step timeouts (docs/steps.md), imported by the workers of
tests/acceptance/test_async_steps.py and test_step_timeouts.py via ONWARD_WORKFLOWS (kept
out of the default list: a gevent worker refuses async workflows at start).

Side channel: a body appends a line to ``$ONWARD_TEST_MARKS/<run_id>`` at named points, so
a test counts what bodies did (a body that was interrupted never writes its later marks).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from examples.provider_client import async_provider_tool, provider_tool
from ledger.vocabulary import ToolClass
from tasks import AsyncStepContext, StepContext, Workflow
from tasks.llm_openai import AsyncOpenAIChat
from tests.settings import WorkflowTestSettings

# short call limits: a crashed call's lease (limit + margin) runs out soon, for quick tests
async_offer = async_provider_tool("test.async_offer", "async_offers", ToolClass.IRREVERSIBLE,
                                  timeout_s=3.0)
held_offer = provider_tool("test.held_offer", "held_offers", ToolClass.IRREVERSIBLE)
MODEL = "onward-test-model"


def mark(ctx: Any, what: str) -> None:
    folder = WorkflowTestSettings().test_marks
    if folder:
        with (folder / str(ctx.run_id)).open("a") as marks:
            marks.write(f"{what} attempt={ctx.attempt} pid={os.getpid()}\n")


def _model_url() -> str:
    return os.environ.get("ONWARD_MODEL_URL", "http://127.0.0.1:8780/v1")


class _Model:
    """``AsyncOpenAIChat`` to the model server, built on first use from the environment."""

    timeout_s = 3.0

    def __init__(self) -> None:
        self.built: AsyncOpenAIChat | None = None

    async def complete(self, **kwargs: Any) -> Any:
        if self.built is None:
            self.built = AsyncOpenAIChat(base_url=_model_url(), api_key="test",
                                         timeout_s=self.timeout_s, max_retries=0)
        return await self.built.complete(**kwargs)


class Offer(BaseModel):
    topic: str = "durable agents"
    draft: str = ""
    offer_id: str = ""
    sleep_s: float = 0.0  # after the effect, before the step returns (to kill it there)


# -- an async workflow: a model call, an effect, a second async step -------------------------

async_flow = Workflow("test_async", version=1, state=Offer, llm=_Model(),
                      max_attempts=3)


@async_flow.step(start=True)
async def draft(ctx: AsyncStepContext, state: Offer) -> Any:
    answer = await ctx.llm(model=MODEL, messages=[
        {"role": "user", "content": f"Draft an offer about {state.topic}."}])
    await asyncio.sleep(0)  # the body really is on an event loop
    offer = await ctx.effect(async_offer, topic=state.topic, text=answer.text[:200])
    mark(ctx, "effect_returned")
    if state.sleep_s:
        await asyncio.sleep(state.sleep_s)
    return ctx.goto(publish, draft=answer.text[:200], offer_id=offer["id"])


@async_flow.step
async def publish(ctx: AsyncStepContext, state: Offer) -> Any:
    first, second = await asyncio.gather(  # started in one go: a deterministic order
        ctx.llm(model=MODEL, messages=[{"role": "user", "content": "title"}]),
        ctx.llm(model=MODEL, messages=[{"role": "user", "content": "summary"}]))
    return ctx.finish(offer_id=state.offer_id, title=first.text[:40],
                      summary=second.text[:40])


# -- step timeouts (plain steps) ------------------------------------------------------------

class Hang(BaseModel):
    hang_s: float = 0.0  # the first attempt sleeps this long after its effect
    release_file: str = ""  # the body waits for this file to exist (bounded by its timeout)


timed = Workflow("test_timeout_effect", version=1, state=Hang, max_attempts=3)


@timed.step(start=True, timeout=1.0)
def send_then_hang(ctx: StepContext, state: Hang) -> Any:
    """Sends its effect, then (first attempt) hangs past its 1 s timeout."""
    offer = ctx.effect(held_offer, note="sent once, whatever the timeouts")
    mark(ctx, "effect_returned")
    if ctx.attempt == 1 and state.hang_s:
        time.sleep(state.hang_s)
        mark(ctx, "woke")
    return ctx.finish(offer_id=offer["id"])


long_step = Workflow("test_timeout_long", version=1, state=Hang, max_attempts=3)


@long_step.step(start=True, timeout=30.0)
def wait_for_release(ctx: StepContext, state: Hang) -> Any:
    """Runs longer than the default lease (3 s in tests), well inside its timeout, with no
    heartbeat: it waits for the test to create ``release_file``."""
    mark(ctx, "started")
    while not Path(state.release_file).exists():
        time.sleep(0.05)
    mark(ctx, "released")
    return ctx.finish(attempt=ctx.attempt)


# -- concurrent calls of one async step (docs/steps.md, "Async steps": Order) ---------------

class Pair(BaseModel):
    calls: str = "effects"  # what the two branches call: effects, mixed (llm, effect), models
    keyed: bool = False  # each branch names its call with key=
    late_s: float = 0.5  # how long the late branch waits before its call


pair = Workflow("test_async_pair", version=1, state=Pair, llm=_Model(), max_attempts=3)
BRANCH_CALLS = {"effects": ("effect", "effect"), "mixed": ("llm", "effect"),
                "models": ("llm", "llm")}


@pair.step(start=True)
async def fan_out(ctx: AsyncStepContext, state: Pair) -> Any:
    """Two branches, gathered, each waiting on something outside ``ctx`` first (as a rate
    limiter or a fetch of its own would) before its call: branch a waits the longer on the
    first attempt, branch b on every retry, so their calls reach ``ctx`` in the opposite
    order on a retry. With ``calls="models"`` an effect follows (keyed ``final``)."""

    async def branch(name: str, call: str) -> str:
        late = (name == "a") == (ctx.attempt == 1)
        await asyncio.sleep(state.late_s if late else 0.0)
        key = name if state.keyed else None
        if call == "effect":
            made = await ctx.effect(async_offer, key=key, customer=name)
            return str(made["id"])
        answer = await ctx.llm(model=MODEL, key=key, messages=[
            {"role": "user", "content": f"Greet customer {name}."}])
        return answer.text[:40]

    first, second = BRANCH_CALLS[state.calls]
    a, b = await asyncio.gather(branch("a", first), branch("b", second))
    mark(ctx, "gathered")
    if state.calls == "models":
        await ctx.effect(async_offer, key="final", customer="both")
    return ctx.finish(a=a, b=b)
