"""Hooks through which a step is seen from outside: log context and trace spans.

Called from few places (the executor after a claim, ``ctx`` around model calls and
effects); each is a no-op costing a function call when tracing is off
(``ledger/tracing.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import structlog

from ledger import tracing
from ledger.steps import Claim

if TYPE_CHECKING:
    from tasks.services import StepServices
    from tasks.tools import Tool

__all__ = ["claimed", "effect", "model_call", "read"]


def claimed(claim: Claim) -> None:
    """The step's lease is held: bind its attempt to log lines, describe its span."""
    structlog.contextvars.bind_contextvars(attempt=claim.attempt)
    tracing.describe_step(claim.run_id, claim.seq, claim.attempt, claim.workflow,
                          claim.workflow_version, claim.step)


@contextmanager
def effect(services: StepServices, tool: Tool) -> Iterator[None]:
    """A span around ``ctx.effect``, naming the effect id once it is known."""
    if not tracing.enabled():
        yield
        return
    with tracing.span(f"effect {tool.name}", **{"onward.tool": tool.name,
                                                "onward.tool_class": tool.tool_class.value}
                      ) as opened:
        yield
        effects = services.refs({})["effects"]
        if effects:
            opened.set_attribute("onward.effect_id", effects[-1]["effect_id"])


@contextmanager
def model_call(model: str) -> Iterator[None]:
    """A span around ``ctx.llm``."""
    with tracing.span(f"llm {model}", **{"gen_ai.request.model": model}):
        yield


@contextmanager
def read(tool: Tool) -> Iterator[None]:
    """A span around ``ctx.read``."""
    with tracing.span(f"read {tool.name}", **{"onward.tool": tool.name}):
        yield
