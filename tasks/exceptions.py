"""Errors of the authoring API and the step executor."""

from __future__ import annotations

from ledger.exceptions import OnwardError


class WorkflowDefinitionError(OnwardError):
    """A workflow is declared wrongly (raised at import time, before any run exists)."""


class StepError(OnwardError):
    """Raise from a step to fail it with retry semantics given as data.

    ``non_retryable=True`` fails the run at once instead of spending its attempt budget.
    """

    def __init__(self, message: str, *, non_retryable: bool = False) -> None:
        super().__init__(message)
        self.non_retryable = non_retryable


class OutcomeError(StepError):
    """A step returned something the executor cannot commit (unknown step, invalid state,
    a value that is not JSON, a state over the size limit). Never retried: the code is wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(message, non_retryable=True)


class LeaseLost(OnwardError):
    """Another worker took over this step; the current attempt's work is discarded."""
