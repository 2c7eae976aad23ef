"""Workflows for the corpus replay tests: every kind of call and wait a replay answers from
the record (a model call, a read, two effects, a timer, a signal), and code changes that
make each kind of divergence.

``ONWARD_TEST_CORPUS_VARIANT`` stands for the candidate code: ``prompt`` asks the model
something else, ``extra_read`` reads once more, ``skip_effect`` leaves out the second
effect, ``path`` goes to another step, ``state`` commits another state, ``result`` finishes
with another result, ``crash`` raises, ``clock`` puts the time in the state. Unset, the code
is the one that recorded the runs.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from examples.fake_llm import FakeModel
from ledger.vocabulary import ToolClass
from tasks import StepContext, StepError, Workflow
from tasks.tools import Tool, ToolResult
from tests.settings import WorkflowTestSettings


def variant() -> str:
    return WorkflowTestSettings().test_corpus_variant


def _lookup(params: dict[str, Any], key: str) -> ToolResult:
    return ToolResult("completed", None, {"price": 10 * len(str(params.get("sku", "")))},
                      version="catalog-7")


def _write(payload: dict[str, Any], key: str) -> ToolResult:
    return ToolResult("completed", f"w_{key[:8]}", {"id": f"w_{key[:8]}", **payload})


catalog = Tool("test.catalog", ToolClass.READ, call=_lookup)
ledger_write = Tool("test.ledger_write", ToolClass.IDEMPOTENT_WRITE, call=_write)


class Order(BaseModel):
    sku: str = "seat"
    label: str = ""
    price: int = 0
    booked: str = ""
    noted: str = ""
    confirmed_by: str = ""
    when: str = ""


flow = Workflow("test_corpus_flow", version=1, state=Order, llm=FakeModel(),
                description="classify (llm) → price (read) → book (2 effects) → wait → confirm")


@flow.step(start=True)
def classify(ctx: StepContext, state: Order) -> Any:
    prompt = f"What kind of item is {state.sku}?"
    if variant() == "prompt":
        prompt = f"Classify the item {state.sku} in one word."
    label = ctx.llm(model="m", messages=[{"role": "user", "content": prompt}]).text
    return ctx.goto(price, label=label)


@flow.step
def price(ctx: StepContext, state: Order) -> Any:
    found = ctx.read(catalog, sku=state.sku)
    if variant() == "extra_read":
        ctx.read(catalog, sku=state.sku.upper())
    return ctx.goto(book, price=found["price"])


@flow.step
def book(ctx: StepContext, state: Order) -> Any:
    booked = ctx.effect(ledger_write, sku=state.sku, price=state.price)
    noted = {"id": ""}
    if variant() != "skip_effect":
        noted = ctx.effect(ledger_write, note=f"booked {state.sku}")
    if variant() == "path":
        return ctx.goto(confirm, booked=booked["id"], noted=noted["id"])
    update: dict[str, Any] = {"booked": booked["id"], "noted": noted["id"]}
    if variant() == "state":
        update["noted"] = "changed"
    if variant() == "clock":
        update["when"] = ctx.now().isoformat()
    return ctx.sleep(timedelta(milliseconds=1), then=await_go, **update)


@flow.step
def await_go(ctx: StepContext, state: Order) -> Any:
    if variant() == "crash":
        raise StepError("the candidate code is broken here", non_retryable=True)
    return ctx.wait_for_signal("go", then=confirm, timeout=timedelta(hours=1))


@flow.step
def confirm(ctx: StepContext, state: Order) -> Any:
    signal = ctx.signal("go") or {}
    result = {"booked": state.booked, "by": signal.get("by", "")}
    if variant() == "result":
        result["by"] = "someone else"
    return ctx.finish(**result)


class Chase(BaseModel):
    wait_ms: int = 50
    outcome: str = ""


waits = Workflow("test_corpus_waits", version=1, state=Chase,
                 description="ask (expires → chase) → wait for a reply (times out → give up)")


@waits.step(start=True)
def ask(ctx: StepContext, state: Chase) -> Any:
    return ctx.ask_approval("go_ahead", artifact={"ask": "go ahead?"}, then=proceed,
                            on_expire=chase, expires_in=timedelta(milliseconds=state.wait_ms))


@waits.step
def chase(ctx: StepContext, state: Chase) -> Any:
    expired = (ctx.decision or {}).get("status", "")
    return ctx.wait_for_signal("reply", then=proceed, on_timeout=give_up,
                               timeout=timedelta(milliseconds=state.wait_ms), outcome=expired)


@waits.step
def proceed(ctx: StepContext, state: Chase) -> Any:
    return ctx.finish(outcome="proceeded")


@waits.step
def give_up(ctx: StepContext, state: Chase) -> Any:
    return ctx.finish(outcome=f"gave up after the approval {state.outcome}")
