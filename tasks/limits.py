"""Fleet-wide limits a tool or a model client declares (docs/limits.md).

    model_quota = Limit("openai", concurrency=20, rate="100/s")
    per_tenant = Limit("openai-tenant", concurrency=4, per="tenant")
    llm = OpenAIChat(base_url=..., limits=[model_quota, per_tenant])
    crm = Tool("crm.create", ToolClass.IRREVERSIBLE, call=..., limits=[Limit("crm", rate="10/s")])

All workers together never exceed a limit: before each call that is really made (not one
answered from the record) the step takes a slot of each limit in the ledger; a step that
cannot get one gives its worker and its lease back and waits in the limit's queue (FIFO,
higher priority first) until a slot frees. A slot is given back when the call ends; one
whose holder died frees itself when the time its lease covered the call runs out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.exceptions import WorkflowDefinitionError

__all__ = ["Limit", "LimitScope", "parse_rate"]

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
          "h": 3600.0, "hour": 3600.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*\.?\d*)\s*([a-z]+)\s*$")


def parse_rate(rate: str) -> tuple[int, float]:
    """``"100/s"``, ``"6000/m"``, ``"10/5s"``, ``"1000/h"`` -> (calls, window in seconds)."""
    found = _RATE.match(rate.lower())
    unit = _UNITS.get(found.group(3)) if found else None
    if found is None or unit is None or int(found.group(1)) < 1:
        raise WorkflowDefinitionError(
            f"rate {rate!r} is not a rate: write calls per period, e.g. '100/s', '6000/m', "
            "'10/5s' or '1000/h'")
    window = float(found.group(2)) * unit if found.group(2) else unit
    if window <= 0:
        raise WorkflowDefinitionError(f"rate {rate!r}: the period must be positive")
    return int(found.group(1)), window


@dataclass(frozen=True)
class LimitScope:
    """What a call is, for a limit ``per`` a key: the run's tenant, the model or tool."""

    tenant_id: str
    target: str  # the model (ctx.llm) or the tool's name


@dataclass(frozen=True)
class Limit:
    """At most ``concurrency`` calls in flight and ``rate`` calls started per period, across
    the fleet. ``per`` splits it into one limit per key: ``"tenant"``, ``"model"`` (the
    model or tool name), or a function of the call's ``LimitScope`` (an API key's name)."""

    name: str
    concurrency: int | None = None
    rate: str | None = None
    per: str | Callable[[LimitScope], str] | None = None

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name:
            raise WorkflowDefinitionError(f"limit name {self.name!r}: non-empty, without ':'")
        if self.concurrency is None and self.rate is None:
            raise WorkflowDefinitionError(f"limit {self.name}: give concurrency, rate or both")
        if self.concurrency is not None and self.concurrency < 1:
            raise WorkflowDefinitionError(f"limit {self.name}: concurrency must be >= 1")
        if self.rate is not None:
            parse_rate(self.rate)
        if isinstance(self.per, str) and self.per not in ("tenant", "model"):
            raise WorkflowDefinitionError(f"limit {self.name}: per is 'tenant', 'model' or a "
                                          "function of the call's LimitScope")

    @property
    def rate_window(self) -> tuple[int, float] | None:
        return parse_rate(self.rate) if self.rate is not None else None

    def key(self, scope: LimitScope) -> str:
        """The ledger's key of the limit this call counts against."""
        if self.per is None:
            return self.name
        if callable(self.per):
            part = str(self.per(scope))
        else:
            part = scope.tenant_id if self.per == "tenant" else scope.target
        return f"{self.name}:{part}"


def declared_limits(owner: Any) -> tuple[Limit, ...]:
    """The limits a tool or a model client declares (its ``limits`` attribute)."""
    found = getattr(owner, "limits", None) or ()
    limits = tuple(found)
    for limit in limits:
        if not isinstance(limit, Limit):
            raise WorkflowDefinitionError(f"{owner!r}: limits must be Limit objects")
    return limits
