"""Workflows for tests/integration/test_crypt.py: a state with a sensitive field that goes
into a model prompt, an effect's payload and result, across several checkpoints."""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import BaseModel

from examples.fake_llm import FakeModel
from ledger.vocabulary import ToolClass
from tasks import Sensitive, StepContext, StepError, Workflow
from tasks.tools import Tool, ToolResult


def _call(payload: dict[str, Any], key: str) -> ToolResult:
    return ToolResult("completed", f"crm_{key[:8]}",
                      {"id": f"crm_{key[:8]}", "echo": payload["customer"]})


crm = Tool("test.crypt_crm", ToolClass.IDEMPOTENT_WRITE, call=_call)


class Order(BaseModel):
    customer: Annotated[str, Sensitive]
    amount: int = 10
    text: Annotated[str, Sensitive] = ""  # the model echoes the customer
    crm_id: str = ""
    echo: Annotated[str, Sensitive] = ""
    matched: bool = False
    rounds: int = 0


flow = Workflow("test_crypt", version=1, state=Order, llm=FakeModel())


@flow.step(start=True)
def draft(ctx: StepContext, state: Order) -> Any:
    text = ctx.llm(model="fake-small", messages=[
        {"role": "user", "content": f"offer for {state.customer}: {state.amount} EUR"}]).text
    return ctx.goto(again, text=text)


@flow.step
def again(ctx: StepContext, state: Order) -> Any:
    if state.rounds < 3:
        return ctx.goto(again, rounds=state.rounds + 1)
    return ctx.goto(create)


@flow.step
def create(ctx: StepContext, state: Order) -> Any:
    """Candidate code for tests/integration/test_corpus_crypt.py: with
    ``ONWARD_TEST_CRYPT_VARIANT=echo`` it keeps another (sensitive) echo."""
    created = ctx.effect(crm, customer=state.customer, amount=state.amount)
    echo = created["echo"] + ("!" if os.environ.get("ONWARD_TEST_CRYPT_VARIANT") == "echo"
                              else "")
    return ctx.goto(check, crm_id=created["id"], echo=echo)


@flow.step
def check(ctx: StepContext, state: Order) -> Any:
    """The worker sees the plain values: the effect's result echoed the customer back."""
    return ctx.finish(matched=state.echo == state.customer)


review = Workflow("test_crypt_review", version=1, state=Order)


@review.step(start=True)
def ask(ctx: StepContext, state: Order) -> Any:
    return ctx.ask_approval("send", artifact={"customer": state.customer, "amount": state.amount},
                            then=done)


@review.step
def done(ctx: StepContext, state: Order) -> Any:
    return ctx.finish(matched=True)


signalled = Workflow("test_crypt_signal", version=1, state=Order)


@signalled.step(start=True)
def wait_address(ctx: StepContext, state: Order) -> Any:
    return ctx.wait_for_signal("address", then=deliver)


@signalled.step
def deliver(ctx: StepContext, state: Order) -> Any:
    """The result quotes the customer and the signal's payload: both sensitive."""
    return ctx.finish(customer=state.customer, street=ctx.signal("address")["street"])


refusing = Workflow("test_crypt_error", version=1, state=Order)


@refusing.step(start=True)
def refuse(ctx: StepContext, state: Order) -> Any:
    """A step whose error quotes the sensitive customer (as a validation error would)."""
    raise StepError(f"no account for {state.customer}", non_retryable=True)
