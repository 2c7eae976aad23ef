"""The sales-offer agent of docs/design.md section 4: classify the request with the model, draft
an offer, wait for a sales lead to approve it, create it in the CRM (irreversible,
reconciled by lookup), notify the customer by email (idempotent by key)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from pydantic import BaseModel

from examples.fake_llm import FakeModel
from examples.provider_client import provider_tool
from tasks import Sensitive, StepContext, ToolClass, Workflow

MODEL = "sales-model"

# check_payload: what `onward tools check examples.sales:create_offer` sends to a TEST provider
create_offer = provider_tool("crm.create_offer", "offers", ToolClass.IRREVERSIBLE,
                             recipient_field="customer_id",
                             check_payload={"customer_id": "check-customer", "amount": 100,
                                            "text": "tool check offer"})
send_email = provider_tool("mail.send", "emails", ToolClass.IDEMPOTENT_WRITE,
                           recipient_field="to",
                           check_payload={"to": "check-customer", "subject": "tool check",
                                          "offer_id": "off_check"})


class OfferState(BaseModel):
    customer_id: Annotated[str, Sensitive]  # sealed at rest when encryption keys are set
    request: str = "Please send me a price offer for 10 seats."
    amount: int = 1000
    route: str = ""
    offer_text: Annotated[str, Sensitive] = ""  # names the customer
    offer_id: str = ""
    email_id: str = ""
    require_approval: bool = True  # a person approves the drafted offer before it is sent


offer = Workflow("sales_offer_agent", version=1, state=OfferState, llm=FakeModel(),
                 description="classify → draft → create offer in CRM → email the customer")


@offer.step(start=True)
def classify(ctx: StepContext, state: OfferState) -> Any:
    label = ctx.llm(model=MODEL, messages=[{"role": "user", "content": state.request}],
                    task="classify").text
    if label != "offer":
        return ctx.finish(route=label, offer_id=None)
    return ctx.goto(draft, route=label)


@offer.step
def draft(ctx: StepContext, state: OfferState) -> Any:
    text = ctx.llm(model=MODEL, messages=[
        {"role": "system", "content": "Write a short, friendly offer."},
        {"role": "user", "content": f"{state.customer_id}: {state.amount} EUR"},
    ]).text
    if not state.require_approval:
        return ctx.goto(create, offer_text=text)
    return ctx.ask_approval("send_offer", artifact=offer_artifact(state, text), then=create,
                            approvers=["role:sales_lead"], expires_in=timedelta(hours=24),
                            offer_text=text)


def offer_artifact(state: OfferState, text: str | None = None) -> dict[str, Any]:
    """What the approver reviews; the approval is bound to its sha256."""
    return {"customer_id": state.customer_id, "amount": state.amount,
            "text": state.offer_text if text is None else text}


@offer.step
def create(ctx: StepContext, state: OfferState) -> Any:
    created = ctx.effect(create_offer, customer_id=state.customer_id, amount=state.amount,
                         text=state.offer_text)
    return ctx.goto(notify, offer_id=created["id"])


@offer.step
def notify(ctx: StepContext, state: OfferState) -> Any:
    sent = ctx.effect(send_email, to=state.customer_id, subject="Your offer",
                      offer_id=state.offer_id)
    return ctx.finish(offer_id=state.offer_id, email_id=sent["id"])
