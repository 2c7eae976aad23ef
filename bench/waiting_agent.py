"""The workflow of bench/waiting.py: ask a person to approve a document as the first step,
then finish in one more step. Workers import it with ONWARD_WORKFLOWS=bench.waiting_agent."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from tasks import StepContext, Workflow

WORKFLOW = "bench_waiting"
ACTION = "publish"
APPROVER_ROLE = "bench_approver"


class WaitingState(BaseModel):
    n: int = 0
    expires_s: float = 3600.0


def document(n: int) -> dict[str, Any]:
    """What the approver reviews (the approval is bound to its sha256)."""
    return {"doc": f"bench document {n}", "n": n}


waiting = Workflow(WORKFLOW, version=1, state=WaitingState,
                   description="ask approval → finish")


@waiting.step(start=True)
def ask(ctx: StepContext, state: WaitingState) -> Any:
    return ctx.ask_approval(ACTION, artifact=document(state.n), then=finish,
                            approvers=[f"role:{APPROVER_ROLE}"],
                            expires_in=timedelta(seconds=state.expires_s))


@waiting.step
def finish(ctx: StepContext, state: WaitingState) -> Any:
    return ctx.finish(n=state.n, decided_by=ctx.decision["decided_by"])
