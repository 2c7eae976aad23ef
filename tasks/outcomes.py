"""What a step returns. The executor alone turns these into ledger commits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Goto:
    """Continue with ``step``, after applying ``update`` to the state."""

    step: str
    update: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Finish:
    """The run is complete; ``result`` is recorded on the run."""

    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Fail:
    """The run failed on purpose (a business decision, not a crash). Not retried."""

    reason: str
    details: dict[str, Any] = field(default_factory=dict)


Outcome = Goto | Finish | Fail
