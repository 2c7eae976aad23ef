"""Workflows for fleet-wide limits and per-call retry policies (docs/limits.md).

``test_limited``: one model call to the model server (``ONWARD_MODEL_URL``) through the
official ``openai`` client, which declares ``Limit("test-model", concurrency=N)``, N from
``ONWARD_TEST_MODEL_CONCURRENCY`` (read at each step, so worker processes and the test
process agree). ``test_plain``: a step with no call at all. ``test_flaky`` and
``test_flaky_effect``: a model client and tools whose failures the test plans (the outside
world, faked in process for driver tests). ``test_limited_offer``: one irreversible create
at the reference provider (``ONWARD_EXAMPLE_PROVIDER_URL``) under
``Limit("test-provider", concurrency=1)``.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel

from examples.provider_client import provider_tool
from ledger.vocabulary import CallFailure, ToolClass
from tasks import StepContext, Workflow
from tasks.exceptions import ToolError
from tasks.limits import Limit
from tasks.llm import LLMResponse
from tasks.llm_openai import OpenAIChat
from tasks.retry import RetryPolicy
from tasks.tools import Tool, ToolResult
from tests.settings import WorkflowTestSettings


class LimitedModel:
    """The openai adapter to ONWARD_MODEL_URL, declaring the model server's quota; its time
    limit (which a slot and the lease cover) from ONWARD_TEST_MODEL_TIMEOUT_S."""

    retry = RetryPolicy(attempts=3, backoff_s=0.05, backoff_max_s=0.2)

    @property
    def timeout_s(self) -> float:
        return WorkflowTestSettings().test_model_timeout_s

    @property
    def limits(self) -> tuple[Limit, ...]:
        concurrency = WorkflowTestSettings().test_model_concurrency
        return (Limit("test-model", concurrency=concurrency),)

    def complete(self, **call: Any) -> LLMResponse:
        return OpenAIChat(base_url=os.environ["ONWARD_MODEL_URL"], api_key="test",
                          max_retries=0, timeout_s=self.timeout_s).complete(**call)


class Topic(BaseModel):
    topic: str
    answer: str = ""


test_limited = Workflow("test_limited", version=1, state=Topic, llm=LimitedModel())


@test_limited.step(start=True)
def ask(ctx: StepContext, state: Topic) -> Any:
    reply = ctx.llm(model="gpt-test", messages=[{"role": "user", "content": state.topic}])
    return ctx.finish(answer=reply.text)


test_plain = Workflow("test_plain", version=1, state=Topic)


@test_plain.step(start=True)
def note(ctx: StepContext, state: Topic) -> Any:
    return ctx.finish(answer=f"noted {state.topic}")


# a 20 s call limit: the slot and the lease cover a call that long (and the margin), so a
# busy machine cannot let them lapse while a test holds the provider's answer
limited_offer = provider_tool("test.limited_offer", "limited_offers", ToolClass.IRREVERSIBLE,
                              timeout_s=20.0, limits=(Limit("test-provider", concurrency=1),))
test_limited_offer = Workflow("test_limited_offer", version=1, state=Topic)


@test_limited_offer.step(start=True)
def offer(ctx: StepContext, state: Topic) -> Any:
    created = ctx.effect(limited_offer, topic=state.topic)
    return ctx.finish(answer=created["id"])


# -- planned failures (driver tests, in process) --------------------------------------------
class Refusal(Exception):
    """What an SDK raises for an HTTP error: a status code, and the response's headers."""

    def __init__(self, status_code: int, retry_after: str | None = None) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code
        self.response = type("Response", (), {
            "status_code": status_code,
            "headers": {"retry-after": retry_after} if retry_after else {}})()


PLAN: list[BaseException] = []  # what the next calls raise, in order; empty: they succeed
CALLS: list[str] = []  # every call made, by what was called


def _next(name: str) -> None:
    CALLS.append(name)
    if PLAN:
        raise PLAN.pop(0)


class FlakyModel:
    retry = RetryPolicy(attempts=3, backoff_s=0.05, backoff_max_s=0.2,
                        retry_on={CallFailure.RATE_LIMITED, CallFailure.SERVER_ERROR,
                                  CallFailure.TIMEOUT})

    def complete(self, *, model: str, messages: list[dict[str, Any]],
                 **params: Any) -> LLMResponse:
        _next("model")
        return LLMResponse(text=f"answer to {messages[-1]['content']}", model=model)


def _send(payload: dict[str, Any], key: str) -> ToolResult:
    _next("send")
    return ToolResult("completed", f"obj-{key[:8]}", {"sent": payload})


send_irreversible = Tool("test.send_irreversible", ToolClass.IRREVERSIBLE, call=_send)
send_idempotent = Tool("test.send_idempotent", ToolClass.IDEMPOTENT_WRITE, call=_send)


class Job(BaseModel):
    topic: str
    tool: str = "irreversible"
    answer: str = ""


test_flaky = Workflow("test_flaky_model", version=1, state=Job, llm=FlakyModel(), max_attempts=3)


@test_flaky.step(start=True)
def think(ctx: StepContext, state: Job) -> Any:
    reply = ctx.llm(model="flaky", messages=[{"role": "user", "content": state.topic}])
    return ctx.finish(answer=reply.text)


test_flaky_effect = Workflow("test_flaky_effect", version=1, state=Job, max_attempts=3)


@test_flaky_effect.step(start=True)
def send(ctx: StepContext, state: Job) -> Any:
    tool = send_irreversible if state.tool == "irreversible" else send_idempotent
    sent = ctx.effect(tool, topic=state.topic)
    return ctx.finish(answer=str(sent))


__all__ = ["CALLS", "PLAN", "Refusal", "ToolError"]
