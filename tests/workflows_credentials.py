"""Workflows for tests/integration/test_credentials.py: a tool that reads its credential by
reference at call time, and steps that misuse it (copy the value into a payload, a state)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ledger.vocabulary import ToolClass
from tasks import StepContext, Workflow, credentials
from tasks.exceptions import ToolError
from tasks.tools import Tool, ToolResult
from tests.settings import WorkflowTestSettings

CREDENTIAL = credentials.reference("test_crm_token")


def _call(payload: dict[str, Any], key: str) -> ToolResult:
    token = credentials.resolve(CREDENTIAL)  # read when the call is made
    if WorkflowTestSettings().test_crm_refuses:
        raise ToolError(f"the CRM refused the token {token}", retryable=False, status_code=401)
    return ToolResult("completed", f"crm_{key[:8]}", {"id": f"crm_{key[:8]}"})


crm = Tool("test.crm", ToolClass.IDEMPOTENT_WRITE, call=_call)


class Customer(BaseModel):
    name: str = "Ada"
    misuse: str = ""  # "", "payload" or "state"
    note: str = ""
    crm_id: str = ""


flow = Workflow("test_credentials", version=1, state=Customer)


@flow.step(start=True)
def register(ctx: StepContext, state: Customer) -> Any:
    payload: dict[str, Any] = {"name": state.name}
    if state.misuse == "payload":
        payload["auth"] = credentials.resolve(CREDENTIAL)
    created = ctx.effect(crm, **payload)
    if state.misuse == "state":
        return ctx.finish(crm_id=created["id"], note=credentials.resolve(CREDENTIAL))
    return ctx.finish(crm_id=created["id"])
