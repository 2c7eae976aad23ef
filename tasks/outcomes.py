"""What a step returns. The executor alone turns these into ledger commits."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

__all__ = ["AskApproval", "Fail", "Finish", "Goto", "Outcome", "Sleep", "WaitSignal"]


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




@dataclass(frozen=True)
class AskApproval:
    """Wait, holding no worker, until a person approves ``artifact`` for ``action``."""

    action: str
    artifact: Any
    then: str
    approvers: tuple[str, ...] = ()
    expires_in: timedelta = timedelta(hours=24)
    on_reject: str | None = None
    on_expire: str | None = None
    update: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WaitSignal:
    """Wait for the named signal (sent with ``Ledger.signal``), optionally with a timeout."""

    name: str
    then: str
    timeout: timedelta | None = None
    on_timeout: str | None = None
    update: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sleep:
    """Continue with ``then`` at ``until`` (a durable timer: a delayed outbox row)."""

    until: datetime
    then: str
    update: dict[str, Any] = field(default_factory=dict)


Outcome = Goto | Finish | Fail | AskApproval | WaitSignal | Sleep
