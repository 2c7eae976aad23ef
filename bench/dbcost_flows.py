"""Workflows for ``bench/dbcost.py``: three step shapes that never finish on their own (the
bench drives as many steps as it measures). Each state carries ``pad`` (about
``--state-bytes`` of random hex), standing for an agent's working state.

* ``dbcost_plain``: a step that only moves on (claim + commit);
* ``dbcost_model``: a step that makes one model call (a fake model, recorded as evidence);
* ``dbcost_effect``: a step that makes one external write through a tool that completes at
  once (intent, attempt, record).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from examples.fake_llm import FakeModel
from ledger.vocabulary import ToolClass
from tasks import StepContext, Workflow
from tasks.tools import Tool, ToolResult


class Pad(BaseModel):
    n: int = 0
    pad: str = ""


plain = Workflow("dbcost_plain", version=1, state=Pad)
model = Workflow("dbcost_model", version=1, state=Pad, llm=FakeModel())
effect = Workflow("dbcost_effect", version=1, state=Pad)

write = Tool("dbcost.write", ToolClass.IDEMPOTENT_WRITE,
             call=lambda payload, key: ToolResult("completed", f"obj-{key[:12]}", {"ok": True}))


@plain.step(start=True)
def move(ctx: StepContext, state: Pad) -> Any:
    return ctx.goto(move, n=state.n + 1)


@model.step(start=True)
def ask(ctx: StepContext, state: Pad) -> Any:
    ctx.llm(model="m", messages=[{"role": "user", "content": f"step {state.n}"}])
    return ctx.goto(ask, n=state.n + 1)


@effect.step(start=True)
def act(ctx: StepContext, state: Pad) -> Any:
    ctx.effect(write, n=state.n)
    return ctx.goto(act, n=state.n + 1)
