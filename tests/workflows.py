"""Workflows the test suite runs in real worker processes (imported via ONWARD_WORKFLOWS)."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from examples.fake_llm import FakeModel
from ledger.vocabulary import ToolClass
from tasks import StepContext, StepError, Workflow
from tasks.tools import Tool


class Counter(BaseModel):
    steps: int = 10  # how many times `tick` runs before the run finishes
    done: int = 0
    sleep_ms: int = 0  # per tick: keeps a step in flight long enough to kill its worker


chain = Workflow("test_chain", version=1, state=Counter, max_attempts=3)


@chain.step(start=True)
def tick(ctx: StepContext, state: Counter) -> Any:
    if state.sleep_ms:
        time.sleep(state.sleep_ms / 1000)
    done = state.done + 1
    if done >= state.steps:
        return ctx.finish(done=done)
    return ctx.goto(tick, done=done)


class Notes(BaseModel):
    steps: int = 8
    sleep_ms: int = 0
    notes: list[str] = []  # one appended per step: checkpoints store deltas


notes_chain = Workflow("test_notes_chain", version=1, state=Notes, max_attempts=3)


@notes_chain.step(start=True)
def note(ctx: StepContext, state: Notes) -> Any:
    if state.sleep_ms:
        time.sleep(state.sleep_ms / 1000)
    notes = [*state.notes, f"note {len(state.notes) + 1} written at seq {ctx.seq} " + "." * 200]
    if len(notes) >= state.steps:
        return ctx.finish(notes=notes)
    return ctx.goto(note, notes=notes)


class Tally(BaseModel):
    steps: int = 6
    tally: list[int] = []  # validation builds every container: the step gets no copy
    box: dict[str, list[int]] = {}


class Boxed(BaseModel):
    steps: int = 6
    box: dict[str, Any] = {}  # typed Any: validation passes the stored containers through


in_place = Workflow("test_in_place", version=1, state=Tally, max_attempts=3)
in_place_any = Workflow("test_in_place_any", version=1, state=Boxed, max_attempts=3)


@in_place.step(start=True)
def change_tally(ctx: StepContext, state: Tally) -> Any:
    """Changes the state it was given in place, as a step may (tasks/fresh_state.py)."""
    state.tally.append(ctx.seq)
    state.box.setdefault("seqs", []).append(ctx.seq)
    return ctx.finish() if len(state.tally) >= state.steps else ctx.goto(change_tally)


@in_place_any.step(start=True)
def change_box(ctx: StepContext, state: Boxed) -> Any:
    """Changes a container of a field typed Any in place."""
    state.box.setdefault("seqs", []).append(ctx.seq)
    return ctx.finish() if len(state.box["seqs"]) >= state.steps else ctx.goto(change_box)


class Nothing(BaseModel):
    pass


poison = Workflow("test_poison", version=1, state=Nothing, max_attempts=3)


@poison.step(start=True)
def die(ctx: StepContext, state: Nothing) -> Any:
    """Kills the worker process that runs it, every time: a crash loop."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


class Flaky(BaseModel):
    fail_times: int = 1  # raise on the first N attempts of the step
    non_retryable: bool = False


flaky = Workflow("test_flaky", version=1, state=Flaky, max_attempts=3)


@flaky.step(start=True)
def wobble(ctx: StepContext, state: Flaky) -> Any:
    if ctx.attempt <= state.fail_times:
        raise StepError(f"failure on attempt {ctx.attempt}", non_retryable=state.non_retryable)
    return ctx.finish(attempt=ctx.attempt)


class Bad(BaseModel):
    mode: str = "unknown_step"
    count: int = 0


broken = Workflow("test_broken", version=1, state=Bad, max_attempts=3)


@broken.step(start=True)
def misbehave(ctx: StepContext, state: Bad) -> Any:
    if state.mode == "unknown_step":
        return ctx.goto("no_such_step")
    if state.mode == "bad_state":
        return ctx.goto(misbehave, count="not a number")
    if state.mode == "unknown_field":
        return ctx.goto(misbehave, nonexistent=1)
    if state.mode == "not_json":
        return ctx.finish(value=object())
    return "not an outcome"


class Pair(BaseModel):
    first_done: bool = False


pair = Workflow("test_pair", version=1, state=Pair, max_attempts=3)


@pair.step(start=True)
def first(ctx: StepContext, state: Pair) -> Any:
    """Two named steps, so a fault point can be armed for the second one only."""
    return ctx.goto(second, first_done=True)


@pair.step
def second(ctx: StepContext, state: Pair) -> Any:
    return ctx.finish(first_done=state.first_done)


class Five(BaseModel):
    fail_at: str = ""  # a step that fails for good (non-retryable), to show a failed task
    shout: bool = False  # each step prints a line (what a careless step does)
    calls: bool = False  # search asks the model, write sends an effect (trace spans)
    nap_ms: int = 0  # read waits this long on a durable timer before write runs
    done: list[str] = []


def _note(payload: dict[str, Any], key: str) -> Any:
    from tasks.tools import ToolResult

    return ToolResult("completed", f"note_{key[:12]}", {"id": f"note_{key[:12]}"})


five_note = Tool("test.five_note", ToolClass.IDEMPOTENT_WRITE, call=_note)
five = Workflow("test_five", version=1, state=Five, max_attempts=3, llm=FakeModel(),
                description="five named steps: plan → search → read → write → publish")


def _five_step(name: str, then: str | None) -> None:
    def body(ctx: StepContext, state: Five) -> Any:
        if state.shout:
            print(f"{name} says hello")
        if state.fail_at == name:
            raise StepError(f"{name} failed on purpose", non_retryable=True)
        if state.calls and name == "search":
            ctx.llm(model="fake", messages=[{"role": "user", "content": "tides"}])
        if state.calls and name == "write":
            ctx.effect(five_note, text="done")
        done = [*state.done, name]
        if state.nap_ms and name == "read":
            return ctx.sleep(timedelta(milliseconds=state.nap_ms), then="write", done=done)
        return ctx.goto(then, done=done) if then else ctx.finish(done=done)

    body.__name__ = name
    five.step(start=name == "plan", name=name)(body)


for _name, _then in (("plan", "search"), ("search", "read"), ("read", "write"),
                     ("write", "publish"), ("publish", None)):
    _five_step(_name, _then)
