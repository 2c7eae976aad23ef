"""Retry policy per tool and per model client (docs/limits.md, "Retries").

A call that fails in a way its policy retries (a timeout, a refused connection, HTTP 429, a
5xx) is not a failure of the step: the step gives its worker and its lease back and runs
again after the policy's backoff, or after the provider's ``Retry-After`` when it is longer
(a deferral: no step attempt is spent). Recorded calls before it are not made again. The
failures of each call are counted in the ledger (``call_retries``), so a crash cannot grant
a fresh allowance; once a call's ``attempts`` are spent, its error reaches the step body,
and from there the step's own retries (``max_attempts``) apply.

Defaults by tool class (``ledger.vocabulary.ToolClass``):

* ``read`` and model calls: retried freely, on every retryable failure;
* ``idempotent_write``: retried with the same idempotency key, on every retryable failure
  (a timeout leaves the outcome unknown: the step that runs again reconciles first);
* ``irreversible``: retried only when the provider refused before doing anything (429, a
  retryable 5xx refusal it stated); a timeout or a lost connection is never retried
  blindly: the outcome is unknown, and the next attempt looks the key up first (or the run
  is parked when the tool has no lookup).
"""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass
from typing import Any

from ledger.vocabulary import CallFailure, ToolClass
from tasks.exceptions import WorkflowDefinitionError

__all__ = ["RetryPolicy", "classify", "default_policy", "retry_after_s"]

_ALL = frozenset(CallFailure)
_REFUSED = frozenset({CallFailure.RATE_LIMITED, CallFailure.SERVER_ERROR})


@dataclass(frozen=True)
class RetryPolicy:
    """How one tool's (or model client's) calls are retried.

    ``attempts`` counts calls, the first included (1: never retried by the policy);
    the n-th retry waits ``backoff_s * 2**(n-1)``, capped at ``backoff_max_s``, with
    jitter (50-100 %); a provider's ``Retry-After`` longer than that is honoured, up to
    ``retry_after_max_s``."""

    attempts: int = 5
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    retry_on: frozenset[CallFailure] = _ALL
    retry_after_max_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise WorkflowDefinitionError("RetryPolicy.attempts counts the first call: >= 1")
        if self.backoff_s < 0 or self.backoff_max_s < 0:
            raise WorkflowDefinitionError("RetryPolicy backoff must not be negative")
        object.__setattr__(self, "retry_on", frozenset(CallFailure(f) for f in self.retry_on))

    def retries(self, failure: CallFailure | None) -> bool:
        return failure is not None and failure in self.retry_on

    def delay_s(self, failures: int, retry_after: float | None = None) -> float:
        """The wait before the call is made again, after its ``failures``-th failure."""
        ceiling = min(self.backoff_max_s, self.backoff_s * 2.0 ** min(max(failures - 1, 0), 60))
        delay = ceiling * (0.5 + random.random() / 2)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.retry_after_max_s))
        return delay


_DEFAULTS = {
    ToolClass.READ: RetryPolicy(),
    ToolClass.IDEMPOTENT_WRITE: RetryPolicy(),
    ToolClass.IRREVERSIBLE: RetryPolicy(attempts=3, retry_on=_REFUSED),
}


def default_policy(tool_class: ToolClass) -> RetryPolicy:
    """The policy of a tool of ``tool_class`` that declares none (model calls: ``read``)."""
    return _DEFAULTS[ToolClass(tool_class)]


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def classify(exc: BaseException) -> CallFailure | None:
    """What kind of failure ``exc`` is, read from what vendor SDKs and HTTP clients raise
    (``status_code``, ``response.status_code``, timeout and connection errors by class),
    without importing them; None: not one a policy retries (a 4xx, a bug, a refusal)."""
    retryable = getattr(exc, "retryable", None)
    status = _status(exc)
    if status == 429:
        return CallFailure.RATE_LIMITED
    if status is not None and status >= 500:
        return CallFailure.SERVER_ERROR
    if status is not None:
        return None
    names = _names(exc)
    if isinstance(exc, TimeoutError) or any("Timeout" in name for name in names):
        return CallFailure.TIMEOUT
    if isinstance(exc, ConnectionError) or names & {"ConnectError", "APIConnectionError",
                                                    "ConnectionError", "RemoteProtocolError"}:
        return CallFailure.CONNECTION
    if retryable is True:  # a ToolError the tool marked retryable, without a status
        return CallFailure.SERVER_ERROR
    return None


def retry_after_s(exc: BaseException) -> float | None:
    """The provider's ``Retry-After`` (seconds or an HTTP date), from ``exc.retry_after_s``
    or the headers of ``exc.response``; None when it gave none."""
    given = getattr(exc, "retry_after_s", None)
    if isinstance(given, int | float):
        return max(0.0, float(given))
    headers: Any = getattr(getattr(exc, "response", None), "headers", None)
    value = headers.get("retry-after") if headers is not None else None
    return parse_retry_after(value)


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
