"""A step's decisions that its body must not be able to swallow.

``ctx`` records a wait (for an accepted effect), a park (an outcome nobody knows), a budget
stop or a replay's divergence on ``Control`` before it raises ``Suspend`` or an error; the
executor reads ``Control.decision`` after the body returns or raises, whatever the body
caught, and that decision stands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger.lineage import Divergence
from ledger.vocabulary import FailReason, ParkReason

__all__ = ["CancelFor", "Control", "DivergeFor", "FailFor", "ParkFor", "Suspend", "WaitFor"]


class Suspend(BaseException):
    """Unwinds a step that must wait or be parked. Not an Exception, so ``except Exception``
    in step code does not catch it; even if something does, ``Control`` still holds the
    decision."""


@dataclass(frozen=True)
class WaitFor:
    delay_s: float
    waiting_on: str
    detail: str


@dataclass(frozen=True)
class ParkFor:
    reason: ParkReason
    error_type: str
    message: str


@dataclass(frozen=True)
class FailFor:
    reason: FailReason
    message: str
    spent: dict[str, Any]


@dataclass(frozen=True)
class DivergeFor:
    """An evidence replay asked for something its parent never recorded: stop it."""

    divergence: Divergence
    report: dict[str, Any]

    @property
    def message(self) -> str:
        return self.divergence.message


@dataclass(frozen=True)
class CancelFor:
    """An operator asked to cancel the run: no new call starts, the run ends ``cancelled``
    once its effects are resolved (or is parked if one stays unknown)."""

    message: str


@dataclass
class Control:
    decision: WaitFor | ParkFor | FailFor | DivergeFor | CancelFor | None = None

    def cancel(self, request: CancelFor) -> None:
        self.decision = request  # stands over every other decision

    def diverge(self, divergence: DivergeFor) -> None:
        if not isinstance(self.decision, (ParkFor, CancelFor)):
            self.decision = divergence

    def fail(self, failure: FailFor) -> None:
        if self.decision is None:
            self.decision = failure

    def park(self, reason: ParkReason, error: Exception) -> None:
        if not isinstance(self.decision, (ParkFor, CancelFor)):
            self.decision = ParkFor(reason, type(error).__name__, str(error))

    def wait(self, wait: WaitFor) -> None:
        if self.decision is None:
            self.decision = wait
