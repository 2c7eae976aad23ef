"""The workflow bench/agents.py runs, and the calls both of its sides make.

``bench_agent``: K steps; each is one model call to the model server (examples/model_server.py)
through the official ``openai`` client, and one step in three also an irreversible write to
the reference provider (examples/provider.py). The model server holds each request for a
time that depends only on the request, so the bench can subtract exactly that from each
step's duration. The plain Celery side (bench/plain_agents.py) makes the same calls, through
``model_client`` and the provider client.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from pydantic import BaseModel

from examples.provider_client import provider_tool
from ledger.vocabulary import ToolClass
from tasks import StepContext, Workflow
from tasks.llm import LLMResponse
from tasks.llm_openai import OpenAIChat

WORKFLOW = "bench_agent"
MODEL = "bench-model"
write = provider_tool("bench.write", "bench_writes", ToolClass.IRREVERSIBLE)


@cache
def model_client() -> OpenAIChat:
    """One client per process (threads and greenlets share it; it is thread-safe). The
    SDK's own retries are off: a 429 fails the step, which onward retries with backoff."""
    return OpenAIChat(base_url=os.environ["ONWARD_MODEL_URL"], api_key="bench",
                      max_retries=0, timeout_s=120.0)


def messages_for(topic: str, n: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are an agent."},
            {"role": "user", "content": f"step {n} of the work on {topic}"}]


def writes_at(n: int) -> bool:
    """Steps 2, 5, 8, ... also write to the provider (one in three)."""
    return n % 3 == 2


class _Model:
    timeout_s = 120.0  # the SDK's time limit (model_client), which the step's lease covers

    def complete(self, **call: Any) -> LLMResponse:
        return model_client().complete(**call)


class AgentState(BaseModel):
    topic: str
    steps: int = 5
    done: int = 0


bench_agent = Workflow(WORKFLOW, version=1, state=AgentState, llm=_Model(), max_attempts=50)


@bench_agent.step(start=True)
def work(ctx: StepContext, state: AgentState) -> Any:
    ctx.llm(model=MODEL, messages=messages_for(state.topic, state.done))
    if writes_at(state.done):
        ctx.effect(write, run=str(ctx.run_id), n=state.done)
    done = state.done + 1
    if done >= state.steps:
        return ctx.finish(done=done)
    return ctx.goto(work, done=done)
