"""Workflows for the "resolve, never abandon" tests: effects whose outcome is unknown when
a run is refused, fails, passes its deadline or is cancelled (tests/integration/
test_effect_outcomes.py drives them in-process; tests/acceptance/test_cancel.py with real
workers and the reference provider).

``OUTSIDE`` is a provider living in the test process: it creates objects by key, can act
and then lose its answer, and can be asked by key. Only in-process tests use it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from examples.fake_llm import FakeModel
from examples.provider_client import provider_tool
from ledger.vocabulary import ToolClass
from tasks import StepContext, Workflow
from tasks.exceptions import EffectOutcomeUnknown, ToolError
from tasks.retry import RetryPolicy
from tasks.tools import Tool, ToolResult


@dataclass
class Outside:
    """The outside world of the in-process tests: every object it holds, by key."""

    objects: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lose_answers: int = 0  # the next n creates act, then the caller hears nothing
    refuse: int = 0  # then the next n creates are refused with a 503: nothing happens
    timeouts: list[float | None] = field(default_factory=list)  # what each call was given
    job_done: bool = False  # an accepted job (``submit``) finishes when this is set
    status_polls: int = 0

    def reset(self) -> None:
        self.objects.clear()
        self.lose_answers = 0
        self.refuse = 0
        self.timeouts.clear()
        self.job_done = False
        self.status_polls = 0

    def submit(self, payload: dict[str, Any], key: str) -> ToolResult:
        """The provider accepts a job and finishes it later (``job_done``)."""
        self.objects.append((key, {"id": f"job_{key[:8]}", **payload}))
        return ToolResult("accepted", f"job_{key[:8]}")

    def job_status(self, ref: str) -> ToolResult:
        self.status_polls += 1
        if self.job_done:
            return ToolResult("completed", ref, {"id": ref, "report": "ready"})
        return ToolResult("accepted", ref)

    def create(self, payload: dict[str, Any], key: str, *,
               timeout: float | None = None) -> ToolResult:
        self.timeouts.append(timeout)
        if self.refuse > 0 and self.lose_answers == 0:
            self.refuse -= 1
            raise ToolError("provider answered 503: busy, nothing was done", retryable=True,
                            status_code=503)
        ref = f"obj_{len(self.objects) + 1}"
        self.objects.append((key, {"id": ref, **payload}))
        if self.lose_answers > 0:
            self.lose_answers -= 1
            raise ConnectionError("the connection dropped after the request was sent")
        return ToolResult("completed", ref, {"id": ref, **payload})

    def find(self, key: str, *, timeout: float | None = None) -> ToolResult | None:
        self.timeouts.append(timeout)
        for owner, obj in self.objects:
            if owner == key:
                return ToolResult("completed", obj["id"], obj)
        return None

    def create_once(self, payload: dict[str, Any], key: str, *,
                    timeout: float | None = None) -> ToolResult:
        """A provider that deduplicates by key: the same key gives the same object."""
        if self.refuse == 0 or self.lose_answers > 0:
            for owner, obj in self.objects:
                if owner == key:
                    return ToolResult("completed", obj["id"], obj)
        return self.create(payload, key, timeout=timeout)

    def create_slowly(self, payload: dict[str, Any], key: str) -> ToolResult:
        """A client that ignores its time limit (no ``timeout``): the provider takes 4 s and
        makes the object at the end of the request."""
        time.sleep(4.0)
        return self.create(payload, key)

    def count(self, key: str | None = None) -> int:
        return sum(1 for owner, _ in self.objects if key is None or owner == key)


OUTSIDE = Outside()

# These tools leave every retry to the step (``attempts=1``: no retry policy of their own,
# docs/limits.md), so the tests here see each refusal as a failed step attempt.
STEP_RETRIES = RetryPolicy(attempts=1)
with_lookup = Tool("test.outcome.with_lookup", ToolClass.IRREVERSIBLE,
                   call=OUTSIDE.create, lookup=OUTSIDE.find, timeout_s=7.0, retry=STEP_RETRIES)
without_lookup = Tool("test.outcome.without_lookup", ToolClass.IRREVERSIBLE,
                      call=OUTSIDE.create, retry=STEP_RETRIES)
keyed = Tool("test.outcome.keyed", ToolClass.IDEMPOTENT_WRITE, call=OUTSIDE.create_once,
             retry=STEP_RETRIES)
job = Tool("test.outcome.job", ToolClass.IDEMPOTENT_WRITE, call=OUTSIDE.submit,
           status=OUTSIDE.job_status, status_timeout_s=60, retry=STEP_RETRIES)
overrunning = Tool("test.outcome.overrunning", ToolClass.IRREVERSIBLE,
                   call=OUTSIDE.create_slowly, lookup=OUTSIDE.find, timeout_s=1.0,
                   retry=STEP_RETRIES)
TOOLS = {"lookup": with_lookup, "blind": without_lookup, "keyed": keyed, "job": job,
         "overrun": overrunning}


class Send(BaseModel):
    tool: str = "lookup"
    sent: str = ""


send_once = Workflow("test_outcome_send", version=1, state=Send, max_attempts=3)


@send_once.step(start=True)
def send(ctx: StepContext, state: Send) -> Any:
    """One irreversible effect; the test decides whether its answer is lost."""
    done = ctx.effect(TOOLS[state.tool], n=1)
    return ctx.finish(sent=done["id"])


chatty = Workflow("test_outcome_chatty", version=1, state=Send, llm=FakeModel())


@chatty.step(start=True)
def send_then_talk(ctx: StepContext, state: Send) -> Any:
    """Swallows an unknown outcome, then talks to the model until its token budget stops
    it: the refusal must not close the effect the provider may hold."""
    with contextlib.suppress(EffectOutcomeUnknown):
        ctx.effect(TOOLS[state.tool], n=1)
    for i in range(5):
        ctx.llm(model="m", messages=[{"role": "user", "content": f"tell me more {i}"}])
    return ctx.finish()


approved_send = Workflow("test_outcome_approved_send", version=1, state=Send)


@approved_send.step(start=True)
def ask(ctx: StepContext, state: Send) -> Any:
    return ctx.ask_approval("send", artifact={"n": 1}, then=send_approved,
                            expires_in=timedelta(seconds=5))


@approved_send.step
def send_approved(ctx: StepContext, state: Send) -> Any:
    """Acts only while its approval holds: a retry after it expired is refused."""
    done = ctx.effect(with_lookup, n=1)
    return ctx.finish(sent=done["id"])


# -- for real workers: the reference provider over HTTP -----------------------------------
slow_offer = provider_tool("test.slow_offer", "slow_offers", ToolClass.IRREVERSIBLE,
                           timeout_s=10.0)
cancel_offer = provider_tool("test.cancel_offer", "cancel_offers", ToolClass.IRREVERSIBLE)
http_payment = provider_tool("test.http_payment", "payments", ToolClass.IRREVERSIBLE,
                             timeout_s=1.0)


class Steps(BaseModel):
    talks: int = 40


slow_send = Workflow("test_outcome_slow_send", version=1, state=Send)


@slow_send.step(start=True)
def send_slowly(ctx: StepContext, state: Send) -> Any:
    """One call at a provider that holds the request longer than the lease TTL."""
    done = ctx.effect(slow_offer, amount=100)
    return ctx.finish(sent=done["id"])


talker = Workflow("test_outcome_talker", version=1, state=Steps, llm=FakeModel())


@talker.step(start=True)
def talk_then_offer(ctx: StepContext, state: Steps) -> Any:
    """Pays the model again and again (slowly), then sends an offer: a cancel must stop it
    at its next call, so the offer is never sent."""
    for i in range(state.talks):
        ctx.llm(model="m", messages=[{"role": "user", "content": f"think {i}"}])
        time.sleep(0.1)  # the work between two calls
    ctx.effect(cancel_offer, amount=100)
    return ctx.finish()


slow_http = Workflow("test_outcome_slow_http", version=1, state=Send)


@slow_http.step(start=True)
def pay_over_http(ctx: StepContext, state: Send) -> Any:
    """One payment through the reference HTTP client (tests/integration/test_call_deadlines)."""
    done = ctx.effect(http_payment, amount=77)
    return ctx.finish(sent=done["id"])
