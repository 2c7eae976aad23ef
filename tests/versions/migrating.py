"""Shared pieces of the ``test_migrating`` deploys (tests/versions/migrating_v*.py): a CRM
tool and a model whose real calls are counted, and the steps every version defines.

``send`` asks the model, then creates a CRM offer (an irreversible effect whose provider can
be asked by key); version 1 has a bug after that call and raises. ``ask`` waits for an
approval or a signal; ``act`` reads the decision and the signal it resumes after.
``ONWARD_TEST_CRM_CALLS`` names the file where the CRM appends one line per object created.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from examples.fake_llm import FakeModel
from ledger.vocabulary import ToolClass
from tasks import StepContext, StepError, Workflow
from tasks.tools import Tool, ToolResult
from tests.settings import WorkflowTestSettings


def _log() -> Path:
    log = WorkflowTestSettings().test_crm_calls
    if log is None:
        raise RuntimeError("ONWARD_TEST_CRM_CALLS names no file: the test sets it")
    return log


def crm_objects() -> list[str]:
    """The idempotency keys of the offers the CRM created, one per object."""
    return _log().read_text().splitlines() if _log().exists() else []


def _create(payload: dict[str, Any], key: str) -> ToolResult:
    if key not in crm_objects():  # the CRM dedupes by key, as the real one does
        with _log().open("a") as handle:
            handle.write(f"{key}\n")
    return ToolResult("completed", f"offer_{key[:12]}", {"id": f"offer_{key[:12]}"})


def _find(key: str) -> ToolResult | None:
    if key not in crm_objects():
        return None
    return ToolResult("completed", f"offer_{key[:12]}", {"id": f"offer_{key[:12]}"})


create_offer = Tool("test.crm_offer", ToolClass.IRREVERSIBLE, call=_create, lookup=_find)
model = FakeModel()


def define_steps(workflow: Workflow[Any], customer: str) -> None:
    """The steps of every version; ``customer`` names the state field holding the customer
    (``customer`` in schema 1, ``customer_id`` in schema 2)."""

    @workflow.step(start=True)
    def prepare(ctx: StepContext, state: Any) -> Any:
        return ctx.goto(ask if state.wait else send)

    @workflow.step
    def send(ctx: StepContext, state: Any) -> Any:
        who = getattr(state, customer)
        pitch = ctx.llm(model="m", messages=[{"role": "user", "content": f"offer {who}"}]).text
        offer = ctx.effect(create_offer, customer=who, amount=100)
        if workflow.version == 1:
            raise StepError("v1 has a bug after the CRM call")
        return ctx.finish(offer=offer["id"], pitch=pitch, version=workflow.version)

    @workflow.step
    def ask(ctx: StepContext, state: Any) -> Any:
        if state.wait == "approval":
            return ctx.ask_approval("send_offer", artifact={"customer": getattr(state, customer)},
                                    then=act, expires_in=timedelta(minutes=10))
        return ctx.wait_for_signal("go", then=act)

    @workflow.step
    def act(ctx: StepContext, state: Any) -> Any:
        decision = ctx.decision
        pitch = ctx.llm(model="m", messages=[{"role": "user", "content": "act"}]).text
        return ctx.finish(
            decided_by=decision["decided_by"] if decision else None,
            signal=ctx.signal("go"), pitch=pitch, version=workflow.version,
            customer=getattr(state, customer))
