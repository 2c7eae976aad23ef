"""Workflows for tests/integration/test_claim_cover.py: model calls whose time limit the
claim's lease covers (a step ``timeout`` longer than the call's), or does not (a model whose
time limit is longer than the lease), a step that calls twice, a step claimed by the
commit of the one before it (eager continuation), and a step whose request changes between
attempts."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from tasks import StepContext, Workflow
from tasks.llm import LLMResponse


class CountingModel:
    """Answers at once; counts its calls. ``timeout_s``: the time limit the lease covers."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.calls = 0
        self.lock = threading.Lock()
        self.on_call: Callable[[], None] = lambda: None  # a test's look at the lease

    def complete(self, *, model: str, messages: list[dict[str, Any]],
                 **params: Any) -> LLMResponse:
        with self.lock:
            self.calls += 1
        self.on_call()
        return LLMResponse(text=f"answer to {messages[-1]['content']}", model=model,
                           input_tokens=3, output_tokens=2, cost_usd=0.0)


QUICK = CountingModel(timeout_s=10.0)  # leased by the step's timeout (60 s) at the claim
LONG = CountingModel(timeout_s=600.0)  # longer than any claim's lease: covered per call


class Asked(BaseModel):
    calls: int = 1  # model calls the step makes
    fail_first: bool = False  # the first attempt raises after its calls (a retry follows)
    answers: list[str] = []


def _ask(ctx: StepContext, state: Asked) -> Any:
    answers = [ctx.llm(model="m", messages=[{"role": "user", "content": f"q{n}"}]).text
               for n in range(state.calls)]
    if state.fail_first and ctx.attempt == 1:
        raise RuntimeError("transient failure after the calls")
    return ctx.finish(answers=answers)


covered = Workflow("test_cover_timed", version=1, state=Asked, llm=QUICK, max_attempts=3)
covered.step(start=True, timeout=60.0)(_ask)
uncovered = Workflow("test_cover_long_model", version=1, state=Asked, llm=LONG, max_attempts=3)
uncovered.step(start=True)(_ask)

chained = Workflow("test_cover_chained", version=1, state=Asked, llm=QUICK, max_attempts=3)


@chained.step(start=True)
def prepare(ctx: StepContext, state: Asked) -> Any:
    return ctx.goto(asked)


@chained.step(timeout=60.0)
def asked(ctx: StepContext, state: Asked) -> Any:
    return _ask(ctx, state)

drifting = Workflow("test_cover_drifting", version=1, state=Asked, llm=QUICK, max_attempts=3)


@drifting.step(start=True, timeout=60.0)
def drift(ctx: StepContext, state: Asked) -> Any:
    """Asks something else on each attempt (not deterministic up to its call), and its first
    attempt fails after the call: a retry meets an answer recorded for another request."""
    text = ctx.llm(model="m", messages=[{"role": "user", "content": f"a{ctx.attempt}"}]).text
    if ctx.attempt == 1:
        raise RuntimeError("transient failure after the call")
    return ctx.finish(answers=[text])
