"""Workflows for the bad-input tests: steps that hand the ledger what it cannot keep (a NUL
character, deep nesting, an oversized payload or artifact) in each place a value enters it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ledger.vocabulary import ToolClass
from tasks import StepContext, Workflow
from tasks.llm import LLMResponse
from tasks.tools import Tool


class NulModel:
    """Answers with a NUL character in its text; counts the calls it was paid for (with
    ``ONWARD_FAKE_LLM_LOG`` set, each one also appends a line there: calls made by worker
    processes)."""

    timeout_s = 1.0  # it answers at once

    def __init__(self) -> None:
        self.paid = 0
        self.fixed = False  # the provider fixed its encoding: plain text from now on

    def complete(self, *, model: str, messages: list[dict[str, Any]],
                 **params: Any) -> LLMResponse:
        self.paid += 1
        log = os.environ.get("ONWARD_FAKE_LLM_LOG")
        if log:
            with Path(log).open("a") as handle:
                handle.write(f"{os.getpid()}\t{messages[-1]['content']}\n")
        return LLMResponse(text="before after" if self.fixed else "before\x00after",
                           model=model, input_tokens=50, output_tokens=10, cost_usd=0.6)


MODEL = NulModel()
SENT: list[dict[str, Any]] = []
"""Payloads the recorder tool was called with, in this process."""


def _record(payload: dict[str, Any], key: str) -> dict[str, Any]:
    SENT.append(payload)
    return {"id": f"obj-{len(SENT)}"}


recorder = Tool("test.recorder", ToolClass.IDEMPOTENT_WRITE, call=_record)


def nested(depth: int) -> Any:
    """A value with ``depth`` levels of objects."""
    value: Any = "leaf"
    for _ in range(depth):
        value = {"down": value}
    return value


class Bad(BaseModel):
    kind: str = ""
    depth: int = 0
    size: int = 0
    data: dict[str, Any] = {}
    note: str = ""


bad_input = Workflow("test_bad_input", version=1, state=Bad, llm=MODEL, max_attempts=3)


@bad_input.step(start=True)
def hand_over(ctx: StepContext, state: Bad) -> Any:
    """Does what ``state.kind`` names, once."""
    kind = state.kind
    if kind == "nul_answer":
        ctx.llm(model="m", messages=[{"role": "user", "content": "say something odd"}])
    if kind == "nul_state":
        return ctx.goto(done, note="a\x00b")
    if kind == "deep_state":
        return ctx.goto(done, data=nested(state.depth))
    if kind == "nul_approver":
        return ctx.ask_approval("publish", artifact={"doc": 1}, then=done,
                                approvers=["al\x00ice"])
    if kind == "nul_signal":
        return ctx.wait_for_signal("go\x00", then=done)
    if kind == "deep_payload":
        ctx.effect(recorder, doc=nested(state.depth))
    if kind == "big_payload":
        ctx.effect(recorder, doc="x" * state.size)
    if kind == "deep_artifact":
        return ctx.ask_approval("publish", artifact=nested(state.depth), then=done)
    if kind == "big_artifact":
        return ctx.ask_approval("publish", artifact={"doc": "x" * state.size}, then=done)
    if kind == "wait":
        return ctx.wait_for_signal("go", then=done)
    return ctx.finish()


@bad_input.step
def done(ctx: StepContext, state: Bad) -> Any:
    return ctx.finish()
