"""Errors of onward's processes. All derive from ``OnwardError`` (``ledger/exceptions.py``)."""

from __future__ import annotations

from ledger.exceptions import OnwardError

__all__ = ["StepNotCommitted"]


class StepNotCommitted(OnwardError):
    """Raised by the step task after the ledger recorded a failed, retried, parked or
    diverged step, so Celery reports the task as failed (an expected error: no traceback,
    the message is acked; the ledger already holds the outcome)."""
