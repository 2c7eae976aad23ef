"""The async variant of bench/agent_flow.py, for ``bench/agents.py --async``.

``bench_agent_async``: the same K steps, written ``async def``: each awaits one model call
through ``tasks.llm_openai.AsyncOpenAIChat`` (the official client's ``openai.AsyncOpenAI``)
and, one step in three, an irreversible write to the reference provider through an async
tool (``examples.provider_client.async_provider_tool``, ``httpx.AsyncClient``). Both are
awaited on the worker process's event loop (tasks/aio.py). Its own module: a gevent worker
refuses workflows with async parts, so ``ONWARD_WORKFLOWS`` lists this module only for
``--async`` runs. The plain Celery side (bench/plain_agents.py, ``BENCH_ASYNC=1``) makes
the same awaited calls, through ``async_model_client`` and ``plain_write``.
"""

from __future__ import annotations

from typing import Any

from bench.agent_flow import (
    MODEL,
    MODEL_TIMEOUT_S,
    STEP_TIMEOUT_S,
    AgentState,
    built_once,
    messages_for,
    model_client_options,
    quota_limits,
    writes_at,
)
from examples.provider_client import async_provider_tool
from ledger.vocabulary import ToolClass
from tasks import AsyncStepContext, Workflow
from tasks.limits import Limit
from tasks.llm import LLMResponse
from tasks.llm_openai import AsyncOpenAIChat

ASYNC_WORKFLOW = "bench_agent_async"
ASYNC_QUOTA_WORKFLOW = "bench_agent_async_quota"
write = async_provider_tool("bench.write_async", "bench_writes", ToolClass.IRREVERSIBLE)
plain_write = async_provider_tool("bench.plain_write_async", "plain_writes",
                                  ToolClass.IRREVERSIBLE)  # the plain Celery side's

_async_model_client = built_once(lambda: AsyncOpenAIChat(**model_client_options()))


def async_model_client() -> AsyncOpenAIChat:
    """One per process (it builds one ``openai.AsyncOpenAI`` per event loop, on first use
    there); the SDK's retries off, as in bench/agent_flow.py."""
    return _async_model_client()


class _AsyncModel:
    timeout_s = MODEL_TIMEOUT_S

    async def complete(self, **call: Any) -> LLMResponse:
        return await async_model_client().complete(**call)


class _AsyncQuotaModel(_AsyncModel):
    """Declares the model server's quota as a fleet-wide limit (bench/agent_flow.py)."""

    @property
    def limits(self) -> tuple[Limit, ...]:
        return quota_limits()


def _agent(name: str, llm: _AsyncModel) -> Workflow[AgentState]:
    agent = Workflow(name, version=1, state=AgentState, llm=llm, max_attempts=50)

    @agent.step(start=True, timeout=STEP_TIMEOUT_S)
    async def work(ctx: AsyncStepContext, state: AgentState) -> Any:
        await ctx.llm(model=MODEL, messages=messages_for(state.topic, state.done))
        if writes_at(state.done):
            await ctx.effect(write, run=str(ctx.run_id), n=state.done)
        done = state.done + 1
        if done >= state.steps:
            return ctx.finish(done=done)
        return ctx.goto(work, done=done)

    return agent


bench_agent_async = _agent(ASYNC_WORKFLOW, _AsyncModel())
bench_agent_async_quota = _agent(ASYNC_QUOTA_WORKFLOW, _AsyncQuotaModel())
