"""Errors of the authoring API, the tools contract and the step executor. All derive from
``OnwardError`` (``ledger/exceptions.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledger.exceptions import OnwardError

if TYPE_CHECKING:
    from ledger.effects import Effect

__all__ = [
    "CredentialUnavailable",
    "EffectFailed",
    "EffectOutcomeUnknown",
    "FaultSpecError",
    "InjectedFault",
    "LeaseLost",
    "OutcomeError",
    "StepError",
    "StepTimedOut",
    "ToolError",
    "ToolPromiseBroken",
    "WorkflowDefinitionError",
    "WorkflowModuleUnimportable",
]


class WorkflowDefinitionError(OnwardError):
    """A workflow is declared wrongly (raised at import time, before any run exists)."""


class WorkflowModuleUnimportable(OnwardError):
    """A module named in ``ONWARD_WORKFLOWS`` cannot be imported (not found, raised at
    import, does not parse): the message says which and why in one paragraph, the original
    exception is the ``__cause__`` (tasks/workflow_modules.py)."""


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


class CredentialUnavailable(OnwardError):
    """A tool's credential reference (``secret://NAME``) names nothing configured, or is not
    a reference (tasks/credentials.py). The message never holds a credential's value."""


class StepTimedOut(StepError):
    """The step ran past its ``timeout`` (``@wf.step(timeout=...)``): its outcome is not
    committed, and the attempt is retried within the step's attempt budget
    (tasks/deadline.py)."""


class LeaseLost(OnwardError):
    """Another worker took over this step; the current attempt's work is discarded."""


# tools and effects (tasks/tools.py, tasks/effect_calls.py, tasks/toolcheck.py)

class ToolError(OnwardError):
    """The provider answered and refused: nothing happened. ``retryable`` says whether
    trying again can help (a 429 answered before the provider acted, a connection that was
    never made, a 5xx to a read) or not (4xx, a conflict); ``retry_after_s`` is the
    provider's ``Retry-After``, which the tool's retry policy honours (tasks/retry.py).

    A 5xx to a write is not a refusal: the provider may have committed, then failed. Raise
    anything else for it (examples/provider_client.py raises ``WriteOutcomeUnknown``): the
    outcome is unknown, and onward reconciles it by a lookup with the key (docs/effects.md).
    """

    def __init__(self, message: str, *, retryable: bool, status_code: int | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status_code = status_code
        self.retry_after_s = retry_after_s


class EffectFailed(StepError):
    """The provider refused the effect definitively; it will not be sent again."""

    def __init__(self, message: str, effect: Effect | None = None) -> None:
        super().__init__(message, non_retryable=True)
        self.effect = effect


class EffectOutcomeUnknown(StepError):
    """The call may or may not have reached the provider; the next attempt reconciles."""


class ToolPromiseBroken(OnwardError, AssertionError):
    """A tool does not keep a promise its declaration makes (raised by the pytest helper)."""


# named fault points (tasks/faults.py)

class FaultSpecError(OnwardError, ValueError):
    """``ONWARD_FAULTS`` names a fault point, an action or an argument that does not exist;
    the message names the entry and what is known."""


class InjectedFault(OnwardError, RuntimeError):
    """Raised by a fault point armed with the ``raise`` action."""
