"""Workflows for the approval, signal, timer and budget tests."""

from __future__ import annotations

import os
import signal as signals
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from examples.fake_llm import FakeModel
from ledger.vocabulary import ToolClass
from tasks import StepContext, Workflow
from tasks.tools import Tool, ToolResult


class Review(BaseModel):
    doc: str = "offer v1: 10 seats at 1000 EUR"
    expires_s: float = 60
    decided_by: str = ""


review = Workflow("test_review", version=1, state=Review)


@review.step(start=True)
def ask(ctx: StepContext, state: Review) -> Any:
    return ctx.ask_approval("send_offer", artifact={"doc": state.doc}, then=act,
                            approvers=["alice", "role:sales_lead"], on_reject=rejected,
                            expires_in=timedelta(seconds=state.expires_s))


@review.step
def act(ctx: StepContext, state: Review) -> Any:
    decision = ctx.decision
    return ctx.finish(decided_by=decision["decided_by"], status=decision["status"],
                      comment=decision["comment"])


@review.step
def rejected(ctx: StepContext, state: Review) -> Any:
    return ctx.fail("rejected by reviewer", by=ctx.decision["decided_by"])


strict_review = Workflow("test_review_strict", version=1, state=Review)


@strict_review.step(start=True)
def ask_strict(ctx: StepContext, state: Review) -> Any:
    """No rejection or expiry step declared: those end the run as failed."""
    return ctx.ask_approval("publish", artifact={"doc": state.doc}, then=done,
                            expires_in=timedelta(seconds=state.expires_s))


@strict_review.step
def done(ctx: StepContext, state: Review) -> Any:
    return ctx.finish()


expiring_review = Workflow("test_review_expiring", version=1, state=Review)


@expiring_review.step(start=True)
def ask_expiring(ctx: StepContext, state: Review) -> Any:
    """An expiry step declared: the run goes on to ``lapsed`` once the approval expires."""
    return ctx.ask_approval("send_offer", artifact={"doc": state.doc}, then=send_offer,
                            on_expire=lapsed, expires_in=timedelta(seconds=state.expires_s))


@expiring_review.step
def send_offer(ctx: StepContext, state: Review) -> Any:
    return ctx.finish(decided_by=ctx.decision["decided_by"])


@expiring_review.step
def lapsed(ctx: StepContext, state: Review) -> Any:
    return ctx.finish(decided_by="nobody: it expired")


class Waiter(BaseModel):
    timeout_s: float | None = None


waiter = Workflow("test_signal", version=1, state=Waiter)


@waiter.step(start=True)
def wait_go(ctx: StepContext, state: Waiter) -> Any:
    timeout = timedelta(seconds=state.timeout_s) if state.timeout_s else None
    return ctx.wait_for_signal("go", then=got_go, timeout=timeout)


@waiter.step
def got_go(ctx: StepContext, state: Waiter) -> Any:
    return ctx.finish(payload=ctx.signal("go"))


class Patient(BaseModel):
    timeout_s: float = 3600


patient = Workflow("test_signal_or_timeout", version=1, state=Patient)


@patient.step(start=True)
def wait_reply(ctx: StepContext, state: Patient) -> Any:
    return ctx.wait_for_signal("reply", then=replied, on_timeout=gave_up,
                               timeout=timedelta(seconds=state.timeout_s))


@patient.step
def replied(ctx: StepContext, state: Patient) -> Any:
    return ctx.finish(reply=ctx.signal("reply"))


@patient.step
def gave_up(ctx: StepContext, state: Patient) -> Any:
    return ctx.finish(timed_out=True)


either = Workflow("test_signal_or_none", version=1, state=Patient)


@either.step(start=True)
def wait_maybe(ctx: StepContext, state: Patient) -> Any:
    """Goes on at the same step whether the signal came or the wait timed out."""
    return ctx.wait_for_signal("reply", then=maybe, on_timeout=maybe,
                               timeout=timedelta(seconds=state.timeout_s))


@either.step
def maybe(ctx: StepContext, state: Patient) -> Any:
    return ctx.finish(reply=ctx.signal("reply"))


class Twice(BaseModel):
    seen: list[Any] = []


twice = Workflow("test_signal_twice", version=1, state=Twice)


@twice.step(start=True)
def first_go(ctx: StepContext, state: Twice) -> Any:
    return ctx.wait_for_signal("go", then=each_go)


@twice.step
def each_go(ctx: StepContext, state: Twice) -> Any:
    """Waits for "go" again until it has read two of them."""
    seen = [*state.seen, ctx.signal("go")]
    if len(seen) < 2:
        return ctx.wait_for_signal("go", then=each_go, seen=seen)
    return ctx.finish(seen=seen)


class Sleeper(BaseModel):
    seconds: float = 1.0


sleeper = Workflow("test_timer", version=1, state=Sleeper)


@sleeper.step(start=True)
def nap(ctx: StepContext, state: Sleeper) -> Any:
    return ctx.sleep(timedelta(seconds=state.seconds), then=woke)


@sleeper.step
def woke(ctx: StepContext, state: Sleeper) -> Any:
    return ctx.finish()


class Talker(BaseModel):
    turns: int = 0


talker = Workflow("test_talker", version=1, state=Talker, llm=FakeModel())


@talker.step(start=True)
def talk(ctx: StepContext, state: Talker) -> Any:
    """Calls the model once per step, forever: only a budget stops it."""
    ctx.llm(model="m", messages=[{"role": "user", "content": f"turn {state.turns} " * 20}])
    return ctx.goto(talk, turns=state.turns + 1)


class Empty(BaseModel):
    pass


crasher = Workflow("test_crash_budget", version=1, state=Empty, max_attempts=10)


@crasher.step(start=True)
def crash(ctx: StepContext, state: Empty) -> Any:
    os.kill(os.getpid(), signals.SIGKILL)
    raise AssertionError("unreachable")


naive_sleeper = Workflow("test_naive_sleep", version=1, state=Empty)


@naive_sleeper.step(start=True)
def nap_naively(ctx: StepContext, state: Empty) -> Any:
    """Sleeps until a datetime without a time zone: no instant, so it must be refused."""
    return ctx.sleep_until(datetime(2020, 1, 1, 9, 0), then=woke_naively)


@naive_sleeper.step
def woke_naively(ctx: StepContext, state: Empty) -> Any:
    return ctx.finish()


slow_job = Tool("test.slow_job", ToolClass.IDEMPOTENT_WRITE,
                call=lambda payload, key: ToolResult("accepted", f"job_{key[:8]}"),
                status=lambda ref: ToolResult("accepted", ref), status_timeout_s=600)
poller = Workflow("test_slow_job", version=1, state=Empty)


@poller.step(start=True)
def start_job(ctx: StepContext, state: Empty) -> Any:
    """The provider accepts the job and never finishes it: polled until its timeout."""
    return ctx.finish(job=ctx.effect(slow_job, n=1))
