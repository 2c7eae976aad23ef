"""A workflow whose data is chosen by the test, for what the CLI prints: an approval
artifact, an effect payload, a run's result or error (``tests/integration/test_cli_literal.py``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from ledger.vocabulary import ToolClass
from tasks import StepContext, StepError, Workflow
from tasks.tools import Tool, ToolResult


def _echo(payload: dict[str, Any], key: str) -> ToolResult:
    ref = f"echo_{key[:12]}"
    return ToolResult("completed", ref, {"id": ref, "text": payload.get("text")})


echo = Tool("test.echo", ToolClass.IRREVERSIBLE, call=_echo, lookup=lambda key: None,
            recipient=lambda payload: str(payload.get("to")))


class Shown(BaseModel):
    artifact: dict[str, Any] = {}
    ask: bool = False
    text: str = ""  # the effect's payload
    to: str = "someone"
    result: str = ""
    error: str = ""  # raised by the step: the run fails with it


display = Workflow("test_display", version=1, state=Shown,
                   description="ask approval of an artifact? → send an effect → finish or fail")


@display.step(start=True)
def ask(ctx: StepContext, state: Shown) -> Any:
    if state.ask:
        return ctx.ask_approval("release", artifact=state.artifact, then=act,
                                expires_in=timedelta(hours=1))
    return ctx.goto(act)


@display.step
def act(ctx: StepContext, state: Shown) -> Any:
    sent = ctx.effect(echo, text=state.text, to=state.to)
    if state.error:
        raise StepError(state.error, non_retryable=True)
    return ctx.finish(result=state.result, sent=sent["id"])
