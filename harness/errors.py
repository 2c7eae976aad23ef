"""What the harness raises when a process or a server does not do what it should."""

from __future__ import annotations


class HarnessError(RuntimeError):
    """A process or server of the harness failed; the message says which and shows its log."""


class ProcessExited(HarnessError):
    """A process the harness started exited although nobody stopped it."""


class TimedOut(HarnessError, AssertionError):
    """A deadline passed while waiting; an AssertionError too, so a test fails, not errors."""
