"""Workflows for tests/integration/test_crypt.py: a state with a sensitive field that goes
into a model prompt, an effect's payload and result, across several checkpoints."""

from __future__ import annotations

import contextlib
from typing import Annotated, Any

from pydantic import BaseModel, Field

from examples.fake_llm import FakeModel
from ledger.vocabulary import ToolClass
from tasks import Sensitive, StepContext, StepError, ToolError, Workflow
from tasks.exceptions import EffectFailed, EffectOutcomeUnknown
from tasks.retry import RetryPolicy
from tasks.tools import Tool, ToolResult
from tests.settings import WorkflowTestSettings


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
    """With ``ONWARD_TEST_CRYPT_VARIANT=prompt`` it asks the model something else (a replay
    diverges: another request, which quotes the sensitive customer)."""
    polite = ", please" if WorkflowTestSettings().test_crypt_variant == "prompt" else ""
    text = ctx.llm(model="fake-small", messages=[
        {"role": "user", "content": f"offer for {state.customer}: {state.amount} EUR{polite}"}
    ]).text
    return ctx.goto(again, text=text)


@flow.step
def again(ctx: StepContext, state: Order) -> Any:
    if state.rounds < 3:
        return ctx.goto(again, rounds=state.rounds + 1)
    return ctx.goto(create)


@flow.step
def create(ctx: StepContext, state: Order) -> Any:
    """Candidate code for tests/integration/test_corpus_crypt.py: with
    ``ONWARD_TEST_CRYPT_VARIANT=echo`` it keeps another (sensitive) echo; with ``amount``
    it asks for another amount (a replay diverges: another payload)."""
    variant = WorkflowTestSettings().test_crypt_variant
    amount = state.amount + (1 if variant == "amount" else 0)
    created = ctx.effect(crm, customer=state.customer, amount=amount)
    echo = created["echo"] + ("!" if variant == "echo" else "")
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


class Checked(BaseModel):
    """A state whose sensitive field must look like a CRM id: a run started with anything
    else is refused at its restore with pydantic's error, which quotes the value."""

    customer: Annotated[str, Sensitive, Field(pattern=r"^c-\d+$")]


checked = Workflow("test_crypt_invalid", version=1, state=Checked)


@checked.step(start=True)
def never(ctx: StepContext, state: Checked) -> Any:
    return ctx.finish()


def _refuse_customer(payload: dict[str, Any], key: str) -> ToolResult:
    raise ToolError(f"no CRM account for {payload['customer']}", retryable=False,
                    status_code=404)


def _answer_failed(payload: dict[str, Any], key: str) -> ToolResult:
    return ToolResult("failed", None, {"reason": f"unknown customer {payload['customer']}"})


def _busy(payload: dict[str, Any], key: str) -> ToolResult:
    raise ToolError(f"busy, try {payload['customer']} later", retryable=True, status_code=503)


refusing_crm = Tool("test.crypt_refusing_crm", ToolClass.IDEMPOTENT_WRITE, call=_refuse_customer)
failing_crm = Tool("test.crypt_failing_crm", ToolClass.IDEMPOTENT_WRITE, call=_answer_failed)
busy_crm = Tool("test.crypt_busy_crm", ToolClass.IDEMPOTENT_WRITE, call=_busy,
                retry=RetryPolicy(attempts=2, backoff_s=0.0, backoff_max_s=0.0))

provider_errors = Workflow("test_crypt_provider_error", version=1, state=Order)


@provider_errors.step(start=True)
def send(ctx: StepContext, state: Order) -> Any:
    """Three providers' errors that quote the customer: a failure answer, a refusal, and a
    retryable refusal counted by the retry policy."""
    for tool in (failing_crm, busy_crm):
        with contextlib.suppress(EffectFailed, EffectOutcomeUnknown):
            ctx.effect(tool, customer=state.customer)
    ctx.effect(refusing_crm, customer=state.customer)
    return ctx.finish()


class Unmarked(BaseModel):
    """A state with no field marked sensitive."""

    customer: str


unmarked = Workflow("test_crypt_unmarked_error", version=1, state=Unmarked)


@unmarked.step(start=True)
def refuse_unmarked(ctx: StepContext, state: Unmarked) -> Any:
    """A step whose error quotes its state (as a provider's error quoting the request)."""
    raise StepError(f"provider said: invalid email {state.customer}", non_retryable=True)
