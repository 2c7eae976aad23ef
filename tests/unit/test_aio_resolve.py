"""``tasks.aio.resolve``: an async tool's answer is awaited on the process's step loop; only a
call made on that loop's own thread (an async step calling an async tool without await,
which would deadlock) is refused. A loop of someone else's running in the calling thread
(an application's, or a browser test tool's left in a pytest worker) is not a refusal."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tasks.aio import process_loop, resolve


async def _answer() -> int:
    return 42


def test_resolve__awaits_on_the_step_loop_from_a_thread_running_another_loop() -> None:
    async def foreign() -> int:
        return int(resolve(_answer()))

    # a thread of its own: this one may already run a loop (a browser test's, in a pytest
    # worker), where asyncio.run refuses to start another
    answers: list[int] = []
    thread = threading.Thread(target=lambda: answers.append(asyncio.run(foreign())))
    thread.start()
    thread.join(timeout=10)
    assert answers == [42]


def test_resolve__refuses_a_call_made_on_the_step_loop_itself() -> None:
    async def on_step_loop() -> int:
        return int(resolve(_answer()))

    called = asyncio.run_coroutine_threadsafe(on_step_loop(), process_loop())
    with pytest.raises(TypeError, match="without await"):
        called.result(timeout=10)
