"""Workflows for the budget tests: a model that bills a fixed amount per call, a step that
spends until a budget stops it (or crashes, or raises, on the way), and an effect the
provider only accepts and completes after several status polls; models slower than the
lease (within their time limit, and past it)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ledger.vocabulary import ToolClass
from tasks import StepContext, Workflow
from tasks.exceptions import StepError
from tasks.llm import LLMResponse
from tasks.tools import Tool, ToolResult

TOKENS_PER_CALL = 60  # 50 in, 10 out
COST_PER_CALL = 0.6


class FixedPriceModel:
    """Every call bills 60 tokens and $0.60. ``paid_here`` counts the calls this process
    made; with ``ONWARD_FAKE_LLM_LOG`` set, each one also appends a line there. It answers
    at once (a time limit of 1 s for the lease to cover)."""

    timeout_s = 1.0

    def __init__(self) -> None:
        self.paid_here = 0

    def complete(self, *, model: str, messages: list[dict[str, Any]],
                 **params: Any) -> LLMResponse:
        self.paid_here += 1
        log = os.environ.get("ONWARD_FAKE_LLM_LOG")
        if log:
            with Path(log).open("a") as handle:
                handle.write(f"{os.getpid()}\t{messages[-1]['content']}\n")
        return LLMResponse(text=f"answer to {messages[-1]['content']}", model=model,
                           input_tokens=50, output_tokens=10, cost_usd=COST_PER_CALL)


MODEL = FixedPriceModel()


class Spending(BaseModel):
    kill_after: int = 0  # SIGKILL this worker after it paid this many calls
    raise_after: int = 0  # on the first attempt, raise (retryable) after this many calls
    give_up_after: int = 0  # raise a non-retryable error after this many calls
    calls: int = 0


spender = Workflow("test_spender", version=1, state=Spending, llm=MODEL, max_attempts=3)


@spender.step(start=True)
def spend(ctx: StepContext, state: Spending) -> Any:
    """Calls the model until a budget stops the run."""
    calls = 0
    while True:
        ctx.llm(model="m", messages=[{"role": "user", "content": f"call {calls}"}])
        calls += 1
        if state.kill_after and MODEL.paid_here >= state.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if state.raise_after and ctx.attempt == 1 and calls >= state.raise_after:
            raise RuntimeError(f"transient failure after {calls} calls")
        if state.give_up_after and calls >= state.give_up_after:
            raise StepError(f"giving up after {calls} calls", non_retryable=True)


three_calls = Workflow("test_three_calls", version=1, state=Spending, llm=MODEL)


def _ask(ctx: StepContext, name: str) -> None:
    ctx.llm(model="m", messages=[{"role": "user", "content": name}])


@three_calls.step(start=True)
def first(ctx: StepContext, state: Spending) -> Any:
    _ask(ctx, "first")
    return ctx.goto(second)


@three_calls.step
def second(ctx: StepContext, state: Spending) -> Any:
    _ask(ctx, "second")
    return ctx.goto(third)


@three_calls.step
def third(ctx: StepContext, state: Spending) -> Any:
    _ask(ctx, "third")
    return ctx.finish()


POLLS: dict[str, int] = {}
"""Status polls per provider reference, in this process."""


def _accept(payload: dict[str, Any], key: str) -> ToolResult:
    return ToolResult("accepted", provider_ref=f"job-{key[:12]}")


def _status(ref: str) -> ToolResult:
    POLLS[ref] = POLLS.get(ref, 0) + 1
    if POLLS[ref] < 5:
        return ToolResult("accepted", provider_ref=ref)
    return ToolResult("completed", provider_ref=ref, result={"job": ref, "polls": POLLS[ref]})


slow_job = Tool("test.slow_job", ToolClass.IDEMPOTENT_WRITE, call=_accept, status=_status)


class Job(BaseModel):
    pass


polled = Workflow("test_polled_job", version=1, state=Job)


@polled.step(start=True)
def submit(ctx: StepContext, state: Job) -> Any:
    """Sends a job the provider completes after five status polls."""
    return ctx.finish(**ctx.effect(slow_job, kind="report"))


# -- model calls slower than the lease (review F21) ------------------------------------------
class SlowModel:
    """Answers after ``delay_s`` with 10 tokens; declares the time limit ``timeout_s`` (a
    client that overruns it when ``delay_s`` is longer). Counts the calls it was paid for."""

    def __init__(self, delay_s: float, timeout_s: float) -> None:
        self.delay_s = delay_s
        self.timeout_s = timeout_s
        self.paid = 0
        self.lock = threading.Lock()

    def complete(self, *, model: str, messages: list[dict[str, Any]],
                 **params: Any) -> LLMResponse:
        with self.lock:
            self.paid += 1
        time.sleep(self.delay_s)
        return LLMResponse(text="a slow answer", model=model, input_tokens=5, output_tokens=5,
                           cost_usd=0.01)


SLOW_IN_TIME = SlowModel(delay_s=2.5, timeout_s=5.0)  # slower than the lease, within its limit
SLOW_OVERRUN = SlowModel(delay_s=2.5, timeout_s=0.3)  # slower than its own time limit


class Thought(BaseModel):
    answer: str = ""


def _think(ctx: StepContext, state: Thought) -> Any:
    text = ctx.llm(model="big", messages=[{"role": "user", "content": "think"}]).text
    return ctx.finish(answer=text)


think_in_time = Workflow("test_think_in_time", version=1, state=Thought, llm=SLOW_IN_TIME)
think_in_time.step(start=True)(_think)
think_overrun = Workflow("test_think_overrun", version=1, state=Thought, llm=SLOW_OVERRUN)
think_overrun.step(start=True)(_think)


READS = {"calls": 0}


def _slow_read(params: dict[str, Any], key: str, *, timeout: float | None = None) -> ToolResult:
    """A read slower than the lease TTL (2.5 s), within its 5 s time limit."""
    READS["calls"] += 1
    time.sleep(2.5)
    return ToolResult("completed", None, {"price": 42}, version="v1")


slow_catalog = Tool("test.slow_catalog", ToolClass.READ, call=_slow_read, timeout_s=5.0)
read_slowly = Workflow("test_read_slowly", version=1, state=Thought)


@read_slowly.step(start=True)
def look_up(ctx: StepContext, state: Thought) -> Any:
    return ctx.finish(answer=str(ctx.read(slow_catalog, sku="a-1")["price"]))
