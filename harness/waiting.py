"""Waiting with a deadline: the one polling loop of tests, benchmarks and the demo."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from harness.errors import TimedOut

T = TypeVar("T")


def wait_for(predicate: Callable[[], T | None], *, timeout: float, what: str,
             interval: float = 0.05, seen: Callable[[], Any] | None = None) -> T:
    """Poll until ``predicate()`` is truthy and return it; at the deadline raise TimedOut
    with what was seen (``seen()``, or the predicate's last value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"; last seen: {seen()!r}" if seen is not None else f"; last value: {value!r}"
            raise TimedOut(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(interval)
