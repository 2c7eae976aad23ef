"""A step's time limit, ``@wf.step(timeout=...)`` (docs/steps.md, "Timeouts").

The claim takes a lease of at least the timeout and ``ONWARD_TOOL_LEASE_MARGIN_S``
(``Registry.step_leases``), so a step inside its timeout needs no heartbeat. The body is
held to the timeout in three layers:

1. **Interruption**, where the pool allows it. An ``async def`` step is cancelled at the
   deadline on its event loop (tasks/aio.py). A plain step running in a process's main
   thread (the prefork and solo pools) is interrupted by ``SIGALRM``: ``StepTimedOut`` is
   raised in the body, or inside the provider or model call it is waiting on, never inside
   a ledger statement (a ``ctx`` call shields its bookkeeping and raises once it is done).
   A thread cannot be interrupted (threads pool; gevent's greenlets are not either).
2. **Cooperation**, everywhere: a ``ctx`` call made past the deadline raises
   ``StepTimedOut`` before it does anything, and a tool that takes a ``timeout`` keyword is
   given at most the time the step has left.
3. **Refusal**: a body that returns past its deadline (it swallowed the interruption, or
   its pool could not interrupt it) has its outcome discarded; the attempt is recorded as
   failed with ``StepTimedOut`` and retried within the step's attempt budget.

A call interrupted while in flight is recorded with its outcome unknown, so the next attempt
reconciles it (lookup, or a person) before anything is sent again: never a blind resend.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import FrameType

from tasks.exceptions import StepTimedOut

__all__ = [
    "StepDeadline",
    "bound",
    "can_interrupt",
    "check",
    "current",
    "in_force",
    "interruptible",
    "interrupting",
    "shielded",
]


@dataclass(frozen=True)
class StepDeadline:
    """When the running step must be over, on this host's monotonic clock."""

    step: str
    timeout_s: float
    started: float = field(default_factory=time.monotonic)

    @property
    def at(self) -> float:
        return self.started + self.timeout_s

    def remaining(self) -> float:
        return self.at - time.monotonic()

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self.at

    def error(self) -> StepTimedOut:
        return StepTimedOut(
            f"step {self.step} ran past its timeout of {self.timeout_s:g}s; the attempt is "
            "retried within the step's attempt budget (a call it left in flight is "
            "reconciled first)")

    def check(self) -> None:
        """Raise ``StepTimedOut`` once the deadline has passed."""
        if self.passed:
            raise self.error()

    def bound(self, timeout_s: float) -> float:
        """A call's time limit, cut to what the step has left (at least a millisecond, so
        the call fails at once rather than never start)."""
        return max(0.001, min(timeout_s, self.remaining()))


_current: ContextVar[StepDeadline | None] = ContextVar("onward_step_deadline", default=None)


def current() -> StepDeadline | None:
    """The deadline of the step running in this context, if it has a timeout."""
    return _current.get()


@contextmanager
def in_force(deadline: StepDeadline | None) -> Iterator[None]:
    """Make ``deadline`` the current one for the block (None: no limit)."""
    token = _current.set(deadline)
    try:
        yield
    finally:
        _current.reset(token)


def check() -> None:
    """Raise ``StepTimedOut`` if the current step is past its deadline (a no-op otherwise)."""
    deadline = _current.get()
    if deadline is not None:
        deadline.check()


def bound(timeout_s: float) -> float:
    """``timeout_s`` cut to what the current step has left."""
    deadline = _current.get()
    return deadline.bound(timeout_s) if deadline is not None else timeout_s


# -- interruption by SIGALRM (a process's main thread) ----------------------------------------

class _Alarm(threading.local):
    """Per thread; only the main thread's is ever armed."""

    armed: StepDeadline | None = None
    shielded: int = 0  # > 0 inside a ctx call's bookkeeping: the alarm waits
    pending: bool = False  # the alarm rang while shielded


_alarm = _Alarm()


def can_interrupt() -> bool:
    """Whether a plain step in this thread can be interrupted: a process's main thread with
    ``setitimer``, and not gevent's (its greenlets share the main thread)."""
    if not hasattr(signal, "setitimer"):
        return False
    if threading.current_thread() is not threading.main_thread():
        return False
    monkey = sys.modules.get("gevent.monkey")
    return not (monkey is not None and monkey.is_module_patched("threading"))


def _ring(_signum: int, _frame: FrameType | None) -> None:
    deadline = _alarm.armed
    if deadline is None:
        return
    if _alarm.shielded:
        _alarm.pending = True
        return
    _alarm.armed = None  # once
    raise deadline.error()


@contextmanager
def interrupting(deadline: StepDeadline) -> Iterator[None]:
    """Raise ``StepTimedOut`` in this (main) thread at ``deadline``, outside shielded code;
    a no-op where that is impossible (``can_interrupt``)."""
    if not can_interrupt():
        yield
        return
    left = max(0.001, deadline.remaining())
    previous = signal.signal(signal.SIGALRM, _ring)
    _alarm.armed, _alarm.shielded, _alarm.pending = deadline, 0, False
    theirs, interval = signal.setitimer(signal.ITIMER_REAL, left)
    started = time.monotonic()
    if theirs and theirs <= left:  # someone else's alarm rings first: leave it alone
        _alarm.armed = None
        signal.signal(signal.SIGALRM, previous)
        signal.setitimer(signal.ITIMER_REAL, theirs, interval)
        yield
        return
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _alarm.armed, _alarm.shielded, _alarm.pending = None, 0, False
        signal.signal(signal.SIGALRM, previous)
        if theirs:  # put back the alarm that was set before (e.g. pytest-timeout's)
            signal.setitimer(signal.ITIMER_REAL,
                             max(0.001, theirs - (time.monotonic() - started)), interval)


@contextmanager
def shielded() -> Iterator[None]:
    """A ``ctx`` call's bookkeeping (ledger statements): an alarm ringing meanwhile waits
    until the call is done, then raises (unless the call already raised)."""
    _alarm.shielded += 1
    try:
        yield
    finally:
        _alarm.shielded -= 1
    if _alarm.shielded == 0 and _alarm.pending and _alarm.armed is not None:
        deadline, _alarm.armed, _alarm.pending = _alarm.armed, None, False
        raise deadline.error()


@contextmanager
def interruptible() -> Iterator[None]:
    """The provider or model call inside a ``ctx`` call: the alarm may interrupt it (the
    call's attempt is then recorded with its outcome unknown)."""
    depth, _alarm.shielded = _alarm.shielded, 0
    try:
        if _alarm.pending and _alarm.armed is not None:
            deadline, _alarm.armed, _alarm.pending = _alarm.armed, None, False
            raise deadline.error()
        yield
    finally:
        _alarm.shielded = depth
