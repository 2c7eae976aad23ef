"""In-process workflows for async steps and step timeouts (tests/integration): the model
and the provider live in the test process (``LOCAL``), so a test counts every call."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ledger.vocabulary import ToolClass
from tasks import AsyncStepContext, StepContext, StepError, Workflow
from tasks.llm import LLMResponse
from tasks.tools import Tool, ToolResult


@dataclass
class Local:
    """The outside world: objects by idempotency key; each create may hold its answer."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    sends: int = 0
    lookups: int = 0
    model_calls: list[str] = field(default_factory=list)
    hold_s: float = 0.0  # the next create acts, then holds its answer this long
    woke: list[int] = field(default_factory=list)  # attempts whose body got past a hang
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.objects.clear()
            self.model_calls.clear()
            self.woke.clear()
            self.sends = self.lookups = 0
            self.hold_s = 0.0

    def _create(self, payload: dict[str, Any], key: str) -> tuple[dict[str, Any], float]:
        with self.lock:
            self.sends += 1
            obj = {"id": f"obj_{len(self.objects) + 1}", "body": payload}
            self.objects[key] = obj
            hold, self.hold_s = self.hold_s, 0.0
        return obj, hold

    def create(self, payload: dict[str, Any], key: str) -> ToolResult:
        obj, hold = self._create(payload, key)
        time.sleep(hold)
        return ToolResult("completed", obj["id"], obj)

    async def create_async(self, payload: dict[str, Any], key: str) -> ToolResult:
        obj, hold = self._create(payload, key)
        await asyncio.sleep(hold)
        return ToolResult("completed", obj["id"], obj)

    async def find_async(self, key: str) -> ToolResult | None:
        with self.lock:
            self.lookups += 1
            obj = self.objects.get(key)
        return ToolResult("completed", obj["id"], obj) if obj else None

    def find(self, key: str) -> ToolResult | None:
        with self.lock:
            self.lookups += 1
            obj = self.objects.get(key)
        return ToolResult("completed", obj["id"], obj) if obj else None


LOCAL = Local()


class AsyncModel:
    """A deterministic async model client: the prompt's last words, counted."""

    timeout_s = 5.0

    async def complete(self, *, model: str, messages: list[dict[str, Any]],
                       **params: Any) -> LLMResponse:
        prompt = str(messages[-1]["content"])
        await asyncio.sleep(0.01)
        with LOCAL.lock:
            LOCAL.model_calls.append(prompt)
        return LLMResponse(text=f"re: {prompt}", model=model, input_tokens=3, output_tokens=2)


async_tool = Tool("local.async_offer", ToolClass.IRREVERSIBLE, call=LOCAL.create_async,
                  lookup=LOCAL.find_async)
sync_tool = Tool("local.offer", ToolClass.IRREVERSIBLE, call=LOCAL.create, lookup=LOCAL.find)


class Job(BaseModel):
    fail_first: bool = False  # attempt 1 raises after its effect
    hang_s: float = 0.0  # attempt 1 hangs this long after its effect
    hold_s: float = 0.0  # the provider holds the first create's answer this long
    offer_id: str = ""


agent = Workflow("local_async", version=1, state=Job, llm=AsyncModel(), max_attempts=3)


@agent.step(start=True)
async def think(ctx: AsyncStepContext, state: Job) -> Any:
    answer = await ctx.llm(model="m", messages=[{"role": "user", "content": "plan"}])
    offer = await ctx.effect(async_tool, plan=answer.text)
    if state.fail_first and ctx.attempt == 1:
        raise StepError("attempt 1 fails after its effect")
    return ctx.goto(fan_out, offer_id=offer["id"])


@agent.step
async def fan_out(ctx: AsyncStepContext, state: Job) -> Any:
    answers = await asyncio.gather(*(
        ctx.llm(model="m", messages=[{"role": "user", "content": f"part {n}"}])
        for n in range(3)))
    return ctx.finish(offer_id=state.offer_id, parts=[a.text for a in answers])


async_timed = Workflow("local_async_timeout", version=1, state=Job, llm=AsyncModel(),
                       max_attempts=3)


@async_timed.step(start=True, timeout=0.5)
async def slow_send(ctx: AsyncStepContext, state: Job) -> Any:
    if ctx.attempt == 1:
        LOCAL.hold_s = state.hold_s
    offer = await ctx.effect(async_tool, note="once")
    if ctx.attempt == 1 and state.hang_s:
        await asyncio.sleep(state.hang_s)
        LOCAL.woke.append(ctx.attempt)
    return ctx.finish(offer_id=offer["id"])


sync_timed = Workflow("local_sync_timeout", version=1, state=Job, max_attempts=3)


@sync_timed.step(start=True, timeout=0.5)
def send_and_hang(ctx: StepContext, state: Job) -> Any:
    if ctx.attempt == 1:
        LOCAL.hold_s = state.hold_s
    offer = ctx.effect(sync_tool, note="once")
    if ctx.attempt == 1 and state.hang_s:
        time.sleep(state.hang_s)
        LOCAL.woke.append(ctx.attempt)
    return ctx.finish(offer_id=offer["id"])


class Order(BaseModel):
    calls: str = "effects"  # effects, or models


reordered = Workflow("local_reordered", version=1, state=Order, llm=AsyncModel(),
                     max_attempts=3)


@reordered.step(start=True)
def two_calls(ctx: StepContext, state: Order) -> Any:
    """Two calls without a key whose order the retry reverses (as a step that depends on
    time, or whose code changed, would); attempt 1 fails after both."""
    for name in ("a", "b") if ctx.attempt == 1 else ("b", "a"):
        if state.calls == "effects":
            ctx.effect(sync_tool, customer=name)
        else:
            ctx.llm(model="m", messages=[{"role": "user", "content": f"greet {name}"}])
    if ctx.attempt == 1:
        raise StepError("attempt 1 fails after its calls")
    return ctx.finish()


class Gathered(BaseModel):
    sent: int = 0


async def _send_for(ctx: AsyncStepContext, customer: str) -> dict[str, Any]:
    """A helper coroutine making a call without a key (refused when gathered as a task)."""
    return await ctx.effect(async_tool, customer=customer)


swallowed = Workflow("local_swallowed_refusal", version=1, state=Gathered, max_attempts=3)


@swallowed.step(start=True)
async def gather_swallowing(ctx: AsyncStepContext, state: Gathered) -> Any:
    """Keyless calls in helper tasks, gathered with ``return_exceptions=True``: the refusal
    comes back as a value, and the body goes on as if nothing had to be sent."""
    results = await asyncio.gather(_send_for(ctx, "a"), _send_for(ctx, "b"),
                                   return_exceptions=True)
    return ctx.finish(sent=sum(not isinstance(r, BaseException) for r in results))


cancelled_queued = Workflow("local_cancelled_queued", version=1, state=Gathered,
                            max_attempts=3)


@cancelled_queued.step(start=True)
async def cancel_the_second(ctx: AsyncStepContext, state: Gathered) -> Any:
    """Two calls without a key handed to create_task in order: the first is held by the
    provider, the second waits in the step's queue behind it and is cancelled there."""
    LOCAL.hold_s = 0.5
    first = asyncio.create_task(ctx.effect(async_tool, customer="first"))
    second = asyncio.create_task(ctx.effect(async_tool, customer="second"))
    while LOCAL.sends < 1:  # the first is at the provider; the second is queued
        await asyncio.sleep(0.01)
    second.cancel()
    await first
    try:
        await second
    except asyncio.CancelledError:
        return ctx.finish(sent=1)
    return ctx.finish(sent=2)


class Shifted(BaseModel):
    same: bool = False  # every call sends the same payload
    ids: dict[str, str] = {}


cancel_shifts = Workflow("local_cancel_shifts", version=1, state=Shifted, max_attempts=3)


@cancel_shifts.step(start=True)
async def cancel_then_send(ctx: AsyncStepContext, state: Shifted) -> Any:
    """Three calls without a key: ``first`` and ``second`` handed to create_task in order,
    then ``third`` awaited. On attempt 1 only, ``second`` is cancelled while it waits in the
    step's queue behind ``first`` (as an ``asyncio.wait_for`` that ran out would), and the
    attempt fails after its calls; attempt 2 makes all three."""
    def payload(name: str) -> dict[str, Any]:
        return {"customer": "same" if state.same else name}

    if ctx.attempt == 1:
        LOCAL.hold_s = 0.3
    first = asyncio.create_task(ctx.effect(async_tool, **payload("first")))
    second = asyncio.create_task(ctx.effect(async_tool, **payload("second")))
    if ctx.attempt == 1:
        while LOCAL.sends < 1:  # the first is at the provider; the second is queued
            await asyncio.sleep(0.01)
        second.cancel()
    ids = {"first": (await first)["id"]}
    await asyncio.wait([second])
    if not second.cancelled():
        ids["second"] = second.result()["id"]
    ids["third"] = (await ctx.effect(async_tool, **payload("third")))["id"]
    if ctx.attempt == 1:
        raise StepError("attempt 1 fails after its calls")
    return ctx.finish(ids=ids)
