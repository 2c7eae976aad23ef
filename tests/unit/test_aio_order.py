"""``tasks.aio.ordered``: a ``ctx`` call without a key is named by its position among the
step's calls, so it is carried out only where the body's code alone fixes that position
(awaited by the body's own task, or handed by it straight to gather/create_task/wait_for),
and refused, before anything is called or queued, in a task the body started around a
coroutine of its own, whose calls can come in another order on a retry."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from tasks import aio
from tasks.exceptions import OutcomeError

Body = Callable[[Callable[[str], Coroutine[Any, Any, str]],
                 Callable[[str], Coroutine[Any, Any, str]]], Coroutine[Any, Any, Any]]


def _run(body: Body, positions: dict[str, int | None] | None = None,
         hold_s: float = 0.0) -> tuple[Any, list[str]]:
    """Run ``body`` as an async step's body is run; it is given a keyless call and a keyed
    one (each carries out a job on this thread that notes its label, and in ``positions``
    the ordinal it was handed; each job holds this thread ``hold_s``). What it returned or
    raised, and the labels carried out, in order."""
    done: list[str] = []

    def job(label: str) -> Callable[..., str]:
        def note(position: int | None = None) -> str:
            time.sleep(hold_s)
            done.append(label)
            if positions is not None:
                positions[label] = position
            return label
        return note

    def keyless(label: str) -> Coroutine[Any, Any, str]:
        return aio.ordered(job(label), "ctx.llm")

    def keyed(label: str) -> Coroutine[Any, Any, str]:
        return aio.offload(job(label))

    try:
        return aio.run(body(keyless, keyed), None), done
    except OutcomeError as exc:
        return exc, done


async def _helper(call: Callable[[str], Coroutine[Any, Any, str]], label: str,
                  wait_s: float = 0.0) -> str:
    await asyncio.sleep(wait_s)
    return await call(label)


def test_ordered__the_bodys_own_calls_and_calls_it_hands_to_gather_run() -> None:
    """Given calls without a key awaited by the body, gathered, put in tasks and under
    wait_for by the body itself, expect every one carried out, in the order written."""

    async def body(keyless: Any, keyed: Any) -> list[str]:
        first = await keyless("1")
        gathered = await asyncio.gather(keyless("2"), keyless("3"))
        task = asyncio.create_task(keyless("4"))
        timed = await asyncio.wait_for(keyless("5"), timeout=5)
        nested = await _helper(keyless, "6")  # a coroutine awaited in the body's task
        return [first, *gathered, await task, timed, nested]

    result, done = _run(body)
    assert result == done == ["1", "2", "3", "4", "5", "6"]


@pytest.mark.parametrize("first_wait_s", [0.0, 0.2])
def test_ordered__a_call_in_a_task_around_a_helper_is_refused(first_wait_s: float) -> None:
    """Given two helper coroutines gathered (the reviewer's ``gather(f(a), f(b))``), each
    making a call without a key, expect OutcomeError naming key= before either call is
    carried out, whether or not a helper waits first: which task makes a call is fixed by
    the code, so the refusal comes on the first attempt, never only on a retry."""

    async def body(keyless: Any, keyed: Any) -> Any:
        return await asyncio.gather(_helper(keyless, "a", first_wait_s),
                                    _helper(keyless, "b"))

    refused, done = _run(body)
    assert isinstance(refused, OutcomeError), refused
    assert "ctx.llm without key=" in str(refused) and "Pass key=" in str(refused)
    assert done == []


def test_ordered__a_call_a_helper_hands_to_gather_is_refused() -> None:
    """Given a helper task that gathers calls without a key itself (after waiting on
    something else), expect the refusal: the helper's position, not the body's code,
    decides when those calls start."""

    async def fan(keyless: Any) -> Any:
        await asyncio.sleep(0)
        return await asyncio.gather(keyless("x"), keyless("y"))

    async def body(keyless: Any, keyed: Any) -> Any:
        return await asyncio.gather(fan(keyless), fan(keyless))

    refused, done = _run(body)
    assert isinstance(refused, OutcomeError) and done == []


def test_ordered__keyed_calls_run_from_any_task() -> None:
    """Given helper tasks making calls with a key and the body one without, expect every
    call carried out: a key names the call whatever the order."""

    async def body(keyless: Any, keyed: Any) -> list[str]:
        helpers = await asyncio.gather(_helper(keyed, "a", 0.05), _helper(keyed, "b"))
        return [*helpers, await keyless("after")]

    result, done = _run(body)
    assert result == ["a", "b", "after"]
    assert sorted(done) == ["a", "after", "b"]


def test_ordered__a_call_is_numbered_when_the_body_makes_it() -> None:
    """Given keyless calls made, then awaited in another order, one cancelled while it waits
    in the queue behind another, and keyed calls between them, expect each keyless call
    numbered in the order the body made it (the cancelled one keeps its number, so the
    calls after it do not move) and keyed calls numbered not at all."""

    async def body(keyless: Any, keyed: Any) -> list[str]:
        later, sooner = keyless("made 1st"), keyless("made 2nd")
        out = [await sooner, await later, await keyed("keyed")]
        held = asyncio.create_task(keyless("held"))
        queued = asyncio.create_task(keyless("queued"))
        await asyncio.sleep(0.05)  # held runs on the step's thread; queued waits behind it
        queued.cancel()
        out.append(await held)
        with contextlib.suppress(asyncio.CancelledError):
            await queued
        return [*out, await keyless("after")]

    positions: dict[str, int | None] = {}
    result, done = _run(body, positions, hold_s=0.2)
    assert result == ["made 2nd", "made 1st", "keyed", "held", "after"]
    assert done == result  # the cancelled call was never carried out
    assert positions == {"made 2nd": 2, "made 1st": 1, "keyed": None, "held": 3, "after": 5}
