"""``async def`` steps: their bodies run on an event loop of the worker process (docs/steps.md,
"Async steps").

Each worker process has one event loop, in a daemon thread of its own, started on first use
(in each prefork child after the fork). The thread that took the step's message (a prefork
child's main thread, a threads-pool thread) hands the body to that loop and, while it runs,
serves the body's ``ctx`` calls: each awaited ``ctx.llm``, ``ctx.read``, ``ctx.effect``
becomes a job that this thread runs with the same code a plain step runs (tasks/services.py:
one checkpoint, effect and evidence protocol, its ledger statements on this thread's
connections), one job at a time, in the order the calls were made, so their command ids
stay deterministic. A tool or model client whose calls are coroutines is awaited on the
loop (``resolve``), so the loop keeps serving the other steps while this one waits.

A call without ``key=`` is named by its position among the step's calls (its ordinal), so
only calls whose position cannot depend on timing may leave the key out (``ordered``):
those the body's own task awaits, and those the body hands straight to ``asyncio.gather``
or ``create_task``, which start in the order given. One made in a task the body started
around a coroutine of its own (a helper gathered with others) is refused before it is
queued: such tasks interleave by what else they wait on, so their calls may come in
another order on a retry, and the ordinals an earlier attempt recorded would name other
calls (docs/steps.md, "Async steps"). The ordinal is taken when the body makes the call
(``ctx.effect(...)`` returns its awaitable), in the body's program order, not when the
step's thread runs it: a call cancelled while it waits in the queue, or never awaited,
still takes its number, so the calls after it are numbered alike whether or not a cancel
(a timeout that ran out) came on this attempt.

At the step's timeout the body is cancelled on the loop; a ``ctx`` call in flight then
cancels the coroutine it awaits (its attempt is recorded with an unknown outcome) and the
body is only let go once the call's bookkeeping is done.

Not on the gevent pool: gevent replaces the threads and sockets this relies on; a worker
refuses to start there with async workflows (workers/pools.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import os
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ledger.exceptions import EffectFenced, EvidenceFenced
from tasks.deadline import StepDeadline
from tasks.exceptions import LeaseLost, OutcomeError

__all__ = ["StepThread", "offload", "ordered", "process_loop", "resolve", "run"]


T = TypeVar("T")


class _ProcessLoop:
    """The process's event loop and its thread (a new one after a fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def get(self) -> asyncio.AbstractEventLoop:
        if self._loop is not None and self._pid == os.getpid():
            return self._loop
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="onward-step-loop",
                                          daemon=True)
                thread.start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def current(self) -> asyncio.AbstractEventLoop | None:
        """This process's loop if it was started here (never starts one)."""
        return self._loop if self._pid == os.getpid() else None


_process_loop = _ProcessLoop()


def process_loop() -> asyncio.AbstractEventLoop:
    """The event loop async steps, async tools and async model clients run on here."""
    return _process_loop.get()


@dataclass
class _Job:
    """One ``ctx`` call of an async step, run by the step's own thread."""

    fn: Callable[[], Any]
    future: asyncio.Future[Any]
    cancelled: bool = False
    awaiting: set[concurrent.futures.Future[Any]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def cancel(self) -> None:
        """Not started: never run. Running: cancel the coroutines it awaits on the loop."""
        with self.lock:
            self.cancelled = True
            awaiting = list(self.awaiting)
        for waited in awaiting:
            waited.cancel()


class StepThread:
    """The thread that runs one async step's ``ctx`` calls while its body runs on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._open = True
        self._running: _Job | None = None
        self.body: asyncio.Task[Any] | None = None  # the task the step's body runs in
        # the first call refused before it was queued (``ordered``): it ends the step even
        # if the body caught it (asyncio.gather(..., return_exceptions=True), try/except)
        self.refused: OutcomeError | None = None
        self._made = 0  # calls without a key the body has made (``ordered``)

    def position(self, written_in: asyncio.Task[Any] | None) -> int | None:
        """The ordinal of a call without a key the body is making now, in ``written_in``:
        the next one if that is the body's own task (on the loop, in program order);
        ``None`` elsewhere (such a call is refused when awaited, ``ordered``)."""
        if written_in is None or written_in is not self.body:
            return None
        self._made += 1
        return self._made

    # -- on the loop ------------------------------------------------------------------------
    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the step's thread; cancelling this waits until ``fn`` is over."""
        if not self._open:
            raise RuntimeError("a ctx call was made after its step had ended: await every "
                               "task a step starts before it returns")
        job = _Job(fn, self.loop.create_future())
        self._jobs.put(job)
        try:
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            job.cancel()
            while not job.future.done():  # its bookkeeping ends before the body lets go
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([job.future])
            if not job.future.cancelled():
                job.future.exception()  # seen: the cancel is what the body is told
            raise

    def close(self) -> None:
        """The body is over: no further call runs; the step's thread stops serving."""
        self._open = False
        self._jobs.put(None)

    # -- on the step's thread ---------------------------------------------------------------
    def serve(self) -> None:
        """Run the body's calls until ``close``."""
        while (job := self._jobs.get()) is not None:
            self._run(job)

    def _run(self, job: _Job) -> None:
        if job.cancelled or not self._open:
            self._settle(job, None, None, cancel=True)
            return
        self._running = job
        _serving.thread = self
        try:
            result = job.fn()
        except (KeyboardInterrupt, SystemExit) as exc:  # this thread is told to stop
            self._settle(job, None, exc)
            raise
        except BaseException as exc:  # handed to the awaiting body (Suspend included)
            self._settle(job, None, exc)
        else:
            self._settle(job, result, None)
        finally:
            self._running = None
            _serving.thread = None

    def _settle(self, job: _Job, result: Any, error: BaseException | None, *,
                cancel: bool = False) -> None:
        def settle() -> None:
            if job.future.done():
                return
            if cancel:
                job.future.cancel()
            elif error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(result)

        self.loop.call_soon_threadsafe(settle)

    def await_on_loop(self, awaitable: Awaitable[T]) -> T:
        """Wait here for ``awaitable`` run on the loop; the running job's cancel cancels it."""
        waited = asyncio.run_coroutine_threadsafe(_awaited(awaitable), self.loop)
        job = self._running
        if job is not None:
            with job.lock:
                if job.cancelled:
                    waited.cancel()
                job.awaiting.add(waited)
        try:
            return waited.result()
        finally:
            if job is not None:
                with job.lock:
                    job.awaiting.discard(waited)


class _Serving(threading.local):
    thread: StepThread | None = None


_serving = _Serving()
_step_thread: ContextVar[StepThread | None] = ContextVar("onward_step_thread", default=None)


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def resolve(value: Any) -> Any:
    """``value``, or what it resolves to if it is awaitable (an async tool's or model
    client's answer), awaited on the process loop while this thread waits for it."""
    if not inspect.isawaitable(value):
        return value
    running = None
    with contextlib.suppress(RuntimeError):
        running = asyncio.get_running_loop()
    # Blocking the step loop's own thread on it would deadlock: an async step's body called
    # an async tool without await. A loop of someone else's running in this thread (the
    # application's, a test tool's) is not ours to refuse: the answer is awaited on ours.
    if running is not None and running is _process_loop.current():
        if inspect.iscoroutine(value):
            value.close()
        raise TypeError("an async tool or model client was called from inside an event loop "
                        "without await: call it through ctx (await ctx.effect/read/llm)")
    serving = _serving.thread
    if serving is not None:
        return serving.await_on_loop(value)
    waited = asyncio.run_coroutine_threadsafe(_awaited(value), process_loop())
    try:
        return waited.result()
    except BaseException:
        waited.cancel()  # interrupted (a plain step's timeout): stop the coroutine too
        raise


async def offload(fn: Callable[[], T]) -> T:
    """From an async step's body: run ``fn`` (a ``ctx`` call) on the step's thread."""
    thread = _step_thread.get()
    if thread is None:
        raise RuntimeError("an async ctx call needs the async step it belongs to; it was "
                           "awaited outside one")
    return await thread.call(fn)


def ordered(fn: Callable[[int | None], T], call: str) -> Coroutine[Any, Any, T]:
    """``offload`` for a ``ctx`` call without ``key=`` (``call`` names it for the refusal):
    its command id is its position among the step's calls, so it is refused unless that
    position is fixed by the body's code alone. Which task wrote the call, and its position
    (handed to ``fn`` when it runs), are taken here, where the body makes the call: a call
    cancelled before the step's thread runs it keeps its number, so the calls after it do
    not move. Whether it runs there, or in a task of its own, is seen when awaited."""
    written_in = _current_task()
    thread = _step_thread.get()
    position = thread.position(written_in) if thread is not None else None
    return _ordered(fn, call, written_in, position)


async def _ordered(fn: Callable[[int | None], T], call: str,
                   written_in: asyncio.Task[Any] | None, position: int | None) -> T:
    thread = _step_thread.get()
    if thread is not None and not _fixed_position(thread.body, written_in):
        refused = OutcomeError(
            f"{call} without key= in a task the async step started around a coroutine of "
            "its own (asyncio.gather or create_task of a helper): such calls can reach the "
            "step in another order on a retry, and a call without a key is named by its "
            "position, so a retry would take another call's recorded answer or effect for "
            "its own. Pass key= naming what the call is for, unique in the step (e.g. "
            "key=f\"offer:{customer}\"); nothing was called (docs/steps.md, \"Async steps\")")
        if thread.refused is None:
            thread.refused = refused
        raise refused
    return await offload(functools.partial(fn, position))


def _fixed_position(body: asyncio.Task[Any] | None, written_in: asyncio.Task[Any] | None) -> bool:
    """Whether a call written in ``written_in`` and running in the current task takes a
    position the body's code alone decides: written by the body's own task, and run there
    or in a task around this very call (the body handed the call itself to gather,
    create_task or wait_for: such tasks start in the order they were made, before the body
    goes on). A task's top coroutine that is an ``ordered`` call's is this call's."""
    if written_in is not body:
        return False
    running = asyncio.current_task()
    return running is body or getattr(running.get_coro() if running else None, "cr_code",
                                      None) is _ordered.__code__


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no loop running in this thread: offload refuses when awaited
        return None


async def _body(thread: StepThread, body: Coroutine[Any, Any, T],
                deadline: StepDeadline | None) -> T:
    _step_thread.set(thread)  # this task's context; tasks the body starts copy it
    thread.body = asyncio.current_task()
    try:
        if deadline is None:
            return await body
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(loop.time() + deadline.remaining()):
                return await body
        except TimeoutError as exc:
            if deadline.passed:
                raise deadline.error() from exc
            raise
    finally:
        thread.close()


def run(body: Coroutine[Any, Any, T], deadline: StepDeadline | None) -> T:
    """Run an async step's ``body`` on the process loop, serving its ``ctx`` calls on this
    thread until it is over; its result, or what it raised. A call refused before it was
    queued (``ordered``) is raised whatever the body did with it: a step whose code made a
    refused call never commits."""
    loop = process_loop()
    thread = StepThread(loop)
    done = asyncio.run_coroutine_threadsafe(_body(thread, body, deadline), loop)
    thread.serve()
    try:
        outcome = done.result()
    except (LeaseLost, EffectFenced, EvidenceFenced):
        raise  # the attempt is over whatever it did: nothing of it is recorded
    except Exception as exc:
        if thread.refused is not None and exc is not thread.refused:
            raise thread.refused from exc  # the refusal, not what the body made of it
        raise
    if thread.refused is not None:  # the body caught the refusal and went on: it stands
        raise thread.refused
    return outcome
