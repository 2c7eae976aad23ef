"""Tools: how an agent reaches the outside world, and the contract an integrator fulfils.

    create_offer = Tool("crm.create_offer", ToolClass.IRREVERSIBLE,
                        call=crm.create, lookup=crm.find_by_key, status=crm.status)

``call(payload, idempotency_key)`` performs the request, sending ``idempotency_key`` to the
provider; ``lookup(idempotency_key)`` asks whether that key already produced something;
``status(provider_ref)`` polls a job the provider only accepted; ``simulate(payload, key)``
is a sandbox implementation for replays; ``check_payload`` is a sample request that
``onward tools check`` sends to the provider's *test* environment (tasks/toolcheck.py).
Each returns a ToolResult (or a dict, read as a
completed result) and raises ToolError for a refusal the provider stated.

Every call is given a time limit: a callable that takes a ``timeout`` keyword receives the
tool's ``timeout_s`` (default ``ONWARD_TOOL_TIMEOUT_S``) and must be over by then, as a
total deadline for the whole request (not an HTTP client's per-read timeout); onward
extends the step's lease to cover that time (and a margin) before the call starts, so a call
never outlives the lease (docs/effects.md, "Call timeouts and the lease", also says what
onward does about a call that overruns it).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from ledger.vocabulary import EffectAttemptOutcome, ToolClass
from tasks import aio, deadline
from tasks.exceptions import WorkflowDefinitionError
from tasks.limits import Limit, declared_limits
from tasks.retry import RetryPolicy, default_policy

__all__ = ["Call", "Lookup", "Status", "Tool", "ToolResult", "invoke", "takes_timeout"]


@dataclass(frozen=True)
class ToolResult:
    """What the provider said. ``accepted`` means the job is queued, not done."""

    status: Literal["completed", "accepted", "failed"] = "completed"
    provider_ref: str | None = None
    result: dict[str, Any] = field(default_factory=dict)
    version: str | None = None  # for reads: the source version of what was read

    @property
    def outcome(self) -> EffectAttemptOutcome:
        """The attempt outcome this answer records (``completed``, ``accepted`` or
        ``failed``)."""
        return EffectAttemptOutcome(self.status)

    @classmethod
    def coerce(cls, value: ToolResult | dict[str, Any]) -> ToolResult:
        if isinstance(value, ToolResult):
            return value
        if isinstance(value, dict):
            ref = value.get("id")
            return cls("completed", str(ref) if ref is not None else None, value)
        raise TypeError(f"a tool must return ToolResult or dict, not {type(value).__name__}")


# Each may also take a keyword ``timeout`` (seconds), and may be ``async def``: see ``invoke``.
Call = Callable[..., "ToolResult | dict[str, Any] | Awaitable[ToolResult | dict[str, Any]]"]
Lookup = Callable[..., "ToolResult | dict[str, Any] "
                       "| Awaitable[ToolResult | dict[str, Any] | None] | None"]
Status = Callable[..., "ToolResult | dict[str, Any] | Awaitable[ToolResult | dict[str, Any]]"]


@lru_cache(maxsize=1024)
def takes_timeout(function: Callable[..., Any]) -> bool:
    """Whether ``function`` accepts a ``timeout`` keyword (or any keyword)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any((p.name == "timeout" and p.kind is not p.POSITIONAL_ONLY)
               or p.kind is p.VAR_KEYWORD for p in parameters)


def invoke(function: Callable[..., Any], *args: Any, timeout: float) -> Any:
    """Call a tool's callable with its time limit, as ``timeout=`` when it takes one; a
    callable without that keyword must keep to the limit by itself (its client's timeout).

    The limit is cut to what the running step has left of its ``timeout``; the call is the
    part of a ``ctx`` call that the step's deadline may interrupt (tasks/deadline.py). An
    ``async def`` callable is awaited on the worker's event loop (tasks/aio.py)."""
    with deadline.interruptible():
        if takes_timeout(function):
            return aio.resolve(function(*args, timeout=deadline.bound(timeout)))
        return aio.resolve(function(*args))


@dataclass(frozen=True)
class Tool:
    """A declared external capability with its retry class."""

    name: str
    tool_class: ToolClass
    call: Call
    lookup: Lookup | None = None
    status: Status | None = None
    simulate: Call | None = None
    honours_key: bool | None = None  # provider dedupes by Idempotency-Key; default by class
    recipient: Callable[[dict[str, Any]], str | None] | None = None
    store_payload: bool = True  # keep the full payload in the effect record
    status_timeout_s: float = 3600.0  # give up polling an accepted job after this long
    # the provider refuses a key that comes back with another payload; default: honours_key
    refuses_key_reuse: bool | None = None
    check_payload: dict[str, Any] | None = None  # a sample for `onward tools check` (test env)
    timeout_s: float | None = None  # one call's time limit; None: ONWARD_TOOL_TIMEOUT_S
    # fleet-wide limits on its calls, and how its failed calls are retried (docs/limits.md)
    limits: tuple[Limit, ...] = ()
    retry: RetryPolicy | None = None  # None: the default of its class (tasks/retry.py)

    def __post_init__(self) -> None:
        if not self.name:
            raise WorkflowDefinitionError("a tool needs a name")
        if not isinstance(self.tool_class, ToolClass):
            object.__setattr__(self, "tool_class", ToolClass(self.tool_class))
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise WorkflowDefinitionError(f"tool {self.name}: timeout_s must be positive")
        if self.honours_key is None:
            object.__setattr__(self, "honours_key",
                               self.tool_class is ToolClass.IDEMPOTENT_WRITE)
        if self.refuses_key_reuse is None:
            object.__setattr__(self, "refuses_key_reuse", self.honours_key)
        object.__setattr__(self, "limits", declared_limits(self))

    @property
    def retry_policy(self) -> RetryPolicy:
        """Its own retry policy, else its class's default."""
        return self.retry if self.retry is not None else default_policy(self.tool_class)

    @property
    def is_async(self) -> bool:
        """Whether any of its callables is ``async def`` (awaited on the worker's loop)."""
        return any(inspect.iscoroutinefunction(f) for f in
                   (self.call, self.lookup, self.status, self.simulate) if f is not None)

    def timeout_for(self, default_s: float) -> float:
        """This tool's call time limit, given the configured default."""
        return self.timeout_s if self.timeout_s is not None else default_s

    @property
    def can_resend_blind(self) -> bool:
        """Whether a send with unknown outcome may be repeated without a lookup."""
        return bool(self.honours_key) or self.tool_class is ToolClass.READ
