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
import threading
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

from celery import signals
from pydantic import BaseModel

from examples.provider_client import provider_tool
from ledger.vocabulary import ToolClass
from tasks import StepContext, Workflow
from tasks.limits import Limit
from tasks.llm import LLMResponse
from tasks.llm_openai import OpenAIChat

WORKFLOW = "bench_agent"
QUOTA_WORKFLOW = "bench_agent_quota"  # the same agent, its client declaring the quota
MODEL = "bench-model"
write = provider_tool("bench.write", "bench_writes", ToolClass.IRREVERSIBLE)


MODEL_TIMEOUT_S = 120.0  # the SDK's time limit, which the step's lease covers
# The step's time limit: longer than the model call's, so the claim's lease (this and
# ONWARD_TOOL_LEASE_MARGIN_S) already covers the call, which then needs no statement to
# extend it (docs/scaling.md, "Where an agent step's overhead goes")
STEP_TIMEOUT_S = MODEL_TIMEOUT_S + 30.0
T = TypeVar("T")


def model_clients() -> int:
    """SDK clients (connection pools) per process: ``BENCH_MODEL_CLIENTS``, which
    bench/agents.py sets alike for both sides (tasks/llm_openai.py says why)."""
    return max(1, int(os.environ.get("BENCH_MODEL_CLIENTS", "1")))


def model_client_options() -> dict[str, Any]:
    """How a client of either side, sync or async, reaches the model server. The SDK's own
    retries are off: a 429 is retried by onward's policy for model calls, deferring the
    step (tasks/retry.py)."""
    return {"base_url": os.environ["ONWARD_MODEL_URL"], "api_key": "bench",
            "max_retries": 0, "timeout_s": MODEL_TIMEOUT_S, "clients": model_clients()}


def built_once(build: Callable[[], T]) -> Callable[[], T]:
    """``build()``, called once per process and then shared, built under a lock:
    ``functools.cache`` alone lets the first steps of a ``-c 500`` pool each build a client
    (an SSL context and connection pool apiece, tens of ms of CPU each) when they start at
    once."""
    lock = threading.Lock()
    once = cache(build)

    def built() -> T:
        with lock:
            return once()

    return built


_model_client = built_once(lambda: OpenAIChat(**model_client_options()))


def model_client() -> OpenAIChat:
    """One client per process (threads and greenlets share it; it is thread-safe)."""
    return _model_client()


def warm_model_client(**_signal: Any) -> None:
    """Build the process's model client when its worker starts, as an application whose
    workflow module builds its client at import does: importing ``openai`` and building its
    SDK clients took 1.3 s of CPU here (load 10), which the first steps of every run waited
    for under the client's lock (``built_once``) when the first call built it (their
    overhead ~1.9 s, a fifth of the steps with the defaults). Connected for both sides'
    workers (this module is their workflow module and ``bench/plain_agents.py``'s):
    ``worker_process_init`` in a prefork child, ``worker_ready`` in a threads or gevent
    worker's one process. Needs ``ONWARD_MODEL_URL`` (bench/agents.py sets it for the
    workers); without it, nothing."""
    if os.environ.get("ONWARD_MODEL_URL"):
        model_client()


signals.worker_process_init.connect(warm_model_client, weak=False)
signals.worker_ready.connect(warm_model_client, weak=False)


def messages_for(topic: str, n: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are an agent."},
            {"role": "user", "content": f"step {n} of the work on {topic}"}]


def writes_at(n: int) -> bool:
    """Steps 2, 5, 8, ... also write to the provider (one in three)."""
    return n % 3 == 2


class _Model:
    timeout_s = MODEL_TIMEOUT_S

    def complete(self, **call: Any) -> LLMResponse:
        return model_client().complete(**call)


class _QuotaModel(_Model):
    """The same client, declaring the model server's quota as a fleet-wide limit
    (BENCH_QUOTA_CONCURRENCY, BENCH_QUOTA_RATE: what bench/agents.py configured the server
    with), so the fleet keeps inside it instead of meeting 429s (docs/limits.md)."""

    @property
    def limits(self) -> tuple[Limit, ...]:
        return quota_limits()


def quota_limits() -> tuple[Limit, ...]:
    """The model server's quota as bench/agents.py configured it, as a fleet-wide limit."""
    concurrency = int(os.environ.get("BENCH_QUOTA_CONCURRENCY", "0")) or None
    rate = float(os.environ.get("BENCH_QUOTA_RATE", "0"))
    if concurrency is None and not rate:
        return ()
    return (Limit("bench-model", concurrency=concurrency,
                  rate=f"{rate:g}/s" if rate else None),)


class AgentState(BaseModel):
    topic: str
    steps: int = 5
    done: int = 0


def _agent(name: str, llm: _Model) -> Workflow[AgentState]:
    agent = Workflow(name, version=1, state=AgentState, llm=llm, max_attempts=50)

    @agent.step(start=True, timeout=STEP_TIMEOUT_S)
    def work(ctx: StepContext, state: AgentState) -> Any:
        ctx.llm(model=MODEL, messages=messages_for(state.topic, state.done))
        if writes_at(state.done):
            ctx.effect(write, run=str(ctx.run_id), n=state.done)
        done = state.done + 1
        if done >= state.steps:
            return ctx.finish(done=done)
        return ctx.goto(work, done=done)

    return agent


bench_agent = _agent(WORKFLOW, _Model())
bench_agent_quota = _agent(QUOTA_WORKFLOW, _QuotaModel())
