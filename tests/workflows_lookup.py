"""Workflows for the crash tests of a model call whose evidence look-up was skipped
(tests/acceptance/test_crashes.py): ``test_skip_chained`` starts with a step that only
moves on, so the next one is claimed by its commit (eager continuation); that step, ``ask``,
calls the model server (``ONWARD_MODEL_URL``, the official ``openai`` client) with a time
limit its lease covers (its ``timeout`` is longer), so its first call sends no look-up, then
creates an object at the reference provider (``ONWARD_EXAMPLE_PROVIDER_URL``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from examples.provider_client import provider_tool
from ledger.vocabulary import ToolClass
from tasks import StepContext, Workflow
from tasks.limits import Limit
from tasks.retry import RetryPolicy
from tests.workflows_limits import LimitedModel

__all__ = ["ASK_TIMEOUT_S", "SkipModel", "Topic", "chained", "offer"]

ASK_TIMEOUT_S = 12.0  # ask's lease: this and the margin; the call's limit must fit in it
offer = provider_tool("test.skip_offer", "skip_offers", ToolClass.IRREVERSIBLE)


class SkipModel(LimitedModel):
    """tests/workflows_limits.py's openai adapter to ONWARD_MODEL_URL (its time limit from
    ONWARD_TEST_MODEL_TIMEOUT_S, shorter than ``ask``'s timeout: the lease covers it), with
    no limit (no slot to wait for after a crash) and no retry (every call the server counts
    is one the step made)."""

    retry = RetryPolicy(attempts=1)

    @property
    def limits(self) -> tuple[Limit, ...]:
        return ()


class Topic(BaseModel):
    topic: str
    answer: str = ""
    offer_id: str = ""


chained = Workflow("test_skip_chained", version=1, state=Topic, llm=SkipModel(),
                   max_attempts=4)


@chained.step(start=True)
def prepare(ctx: StepContext, state: Topic) -> Any:
    return ctx.goto(ask)


@chained.step(timeout=ASK_TIMEOUT_S)
def ask(ctx: StepContext, state: Topic) -> Any:
    reply = ctx.llm(model="gpt-test", messages=[{"role": "user", "content": state.topic}])
    made = ctx.effect(offer, topic=state.topic, text=reply.text[:200])
    return ctx.finish(answer=reply.text, offer_id=made["id"])
