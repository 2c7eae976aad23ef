"""An async step whose keyless effect calls are in flight when its worker is SIGKILLed, for
tests/acceptance/test_async_kill.py (loaded through ONWARD_WORKFLOWS with the reference
provider's URL in ONWARD_EXAMPLE_PROVIDER_URL).

The body hands three keyless ``ctx.effect`` calls straight to ``asyncio.create_task``, in
order (docs/steps.md, "Async steps": such calls are numbered when the body makes them,
#1, #2, #3). On attempt 1 it cancels the second while it waits in the step's queue behind
the first, which the provider holds: so the first attempt sends ``first`` and ``third``
only, and a retry sends ``second`` and gets the others' outcomes back. A second step
makes one allowed keyless call, then swallows the refusal of keyless calls made in helper
tasks (``asyncio.gather(..., return_exceptions=True)``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from pydantic import BaseModel

from examples.provider_client import async_provider_tool, provider_url
from ledger.vocabulary import ToolClass
from tasks import AsyncStepContext, Workflow

COLLECTION = "kill_offers"
CUSTOMERS = ("first", "second", "third")
# a call's limit: twice the 4 s the tests' provider holds an answer (room for a busy
# machine); a call cut off by the kill leaves its effect to a lookup once the call's lease
# (limit + margin) has run out
kill_offer = async_provider_tool("test.kill_offer", COLLECTION, ToolClass.IRREVERSIBLE,
                                 timeout_s=8.0)


class Sent(BaseModel):
    ids: dict[str, str] = {}


async def _made_at_provider(count: int) -> None:
    """Wait until the provider holds ``count`` objects of the collection (the first call
    acted there and its answer is held: the calls behind it are still queued)."""
    async with httpx.AsyncClient(base_url=provider_url(), timeout=5.0) as client:
        while True:
            stats = (await client.get("/admin/stats")).raise_for_status().json()
            if stats["by_collection"].get(COLLECTION, 0) >= count:
                return
            await asyncio.sleep(0.02)


fan = Workflow("test_async_kill_fan", version=1, state=Sent, max_attempts=5)


@fan.step(start=True)
async def send_three(ctx: AsyncStepContext, state: Sent) -> Any:
    """Three keyless effects as tasks, in order; attempt 1 cancels the second while it is
    queued behind the first (held at the provider)."""
    tasks = {name: asyncio.create_task(ctx.effect(kill_offer, customer=name))
             for name in CUSTOMERS}
    if ctx.attempt == 1:
        await _made_at_provider(1)
        tasks["second"].cancel()
    await asyncio.wait(tasks.values())
    return ctx.finish(ids={name: str(task.result()["id"]) for name, task in tasks.items()
                           if not task.cancelled()})


async def _send_for(ctx: AsyncStepContext, customer: str) -> dict[str, Any]:
    """A helper coroutine making a call without a key: refused when gathered as a task."""
    return dict(await ctx.effect(kill_offer, customer=customer))


swallow = Workflow("test_async_kill_swallow", version=1, state=Sent, max_attempts=5)


@swallow.step(start=True)
async def send_then_swallow(ctx: AsyncStepContext, state: Sent) -> Any:
    """One keyless effect awaited by the body itself (#1, allowed), then two made in helper
    tasks and gathered with ``return_exceptions=True``: their refusal comes back as a
    value, and the body goes on to finish as if they had been made."""
    made = await ctx.effect(kill_offer, customer="first")
    results = await asyncio.gather(_send_for(ctx, "a"), _send_for(ctx, "b"),
                                   return_exceptions=True)
    ids = {"first": str(made["id"])}
    ids.update({name: str(r["id"]) for name, r in zip("ab", results, strict=True)
                if not isinstance(r, BaseException)})
    return ctx.finish(ids=ids)
