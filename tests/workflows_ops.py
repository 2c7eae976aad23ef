"""Workflows for the operator-command tests (replay, branch, continue, cancel, repeat).

``ONWARD_TEST_OPS_VARIANT`` stands for a code change deployed between a run and its replay:
``reworded`` asks the model something else in ``summarize``, ``extra`` makes one more model
call in ``review``. ``ONWARD_TEST_OPS_CALLS`` names a file where the local tool appends one
line per real call (the outside world's count).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from examples.fake_llm import FakeModel
from ledger.vocabulary import ToolClass
from tasks import StepContext, StepError, Workflow
from tasks.tools import Tool, ToolResult
from tests.settings import WorkflowTestSettings


def variant() -> str:
    return WorkflowTestSettings().test_ops_variant


def _append(kind: str, payload: dict[str, Any], key: str) -> ToolResult:
    log = WorkflowTestSettings().test_ops_calls
    if log:
        with log.open("a") as handle:
            handle.write(f"{kind}\t{key}\t{payload}\n")
    ref = f"{kind}_{key[:12]}"
    return ToolResult("completed", ref, {"id": ref, "payload": payload})


def calls(path: Path) -> list[str]:
    """The real calls the local tool made (one line each)."""
    return path.read_text().splitlines() if path.exists() else []


publish = Tool("test.publish", ToolClass.IRREVERSIBLE,
               call=lambda payload, key: _append("real", payload, key),
               lookup=lambda key: None,
               simulate=lambda payload, key: _append("sandbox", payload, key),
               recipient=lambda payload: str(payload.get("channel")))
log_line = Tool("test.log_line", ToolClass.IDEMPOTENT_WRITE,
                call=lambda payload, key: _append("log", payload, key))


class Note(BaseModel):
    topic: str = "pricing"
    channel: str = "news"
    summary: str = ""
    post_id: str = ""
    approve: bool = False  # ask a person before publishing


notes = Workflow("test_ops_notes", version=1, state=Note, llm=FakeModel(),
                 description="summarize (llm) → review (approval?) → publish (irreversible)")


@notes.step(start=True)
def summarize(ctx: StepContext, state: Note) -> Any:
    prompt = f"Summarize {state.topic}"
    if variant() == "reworded":
        prompt = f"Give me a summary of {state.topic}"
    text = ctx.llm(model="m", messages=[{"role": "user", "content": prompt}]).text
    return ctx.goto(review, summary=text)


@notes.step
def review(ctx: StepContext, state: Note) -> Any:
    if variant() == "extra":
        ctx.llm(model="m", messages=[{"role": "user", "content": "double-check it"}])
    ctx.effect(log_line, line=f"reviewed {state.topic}")
    if state.approve:
        return ctx.ask_approval("publish", artifact={"summary": state.summary}, then=post,
                                expires_in=timedelta(hours=1))
    return ctx.goto(post)


@notes.step
def post(ctx: StepContext, state: Note) -> Any:
    posted = ctx.effect(publish, channel=state.channel, text=state.summary)
    return ctx.finish(post_id=posted["id"])


class Fragile(BaseModel):
    sent: str = ""


fragile = Workflow("test_ops_fragile", version=1, state=Fragile, max_attempts=2)


@fragile.step(start=True)
def attempt_send(ctx: StepContext, state: Fragile) -> Any:
    """Fails for good while ``ONWARD_TEST_OPS_BROKEN`` is set: a bug fixed by a deploy."""
    if WorkflowTestSettings().test_ops_broken:
        raise StepError("the template is broken", non_retryable=True)
    sent = ctx.effect(log_line, line="sent")
    return ctx.finish(sent=sent["id"])
