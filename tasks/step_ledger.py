"""The seam between the executor and the ledger: the statements one claimed step runs.

``ledger.steps.StepStore`` is the real one (PostgreSQL, one statement each); the unit tests
drive the executor's decision table through an in-memory one (tests/unit/fake_ledger.py),
in the manner of dramatiq's stub broker. Every method but ``claim`` is fenced by the
claim's lease: False (or ``Ended.LOST``) means the lease was lost and nothing was written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol
from uuid import UUID

from ledger.hot import HotConnection
from ledger.steps import Advance, Claim, Ended, Stale, Successor
from ledger.vocabulary import ParkReason

__all__ = ["StepLedger"]


class StepLedger(Protocol):
    """What ``execute_step`` asks of the ledger (docs/design.md section 4)."""

    @property
    def conn(self) -> HotConnection:
        """The connection the step's effect and evidence stores use by default."""
        ...

    def claim(self, run_id: UUID, seq: int, owner: str, *, count_stale: bool = True,
              bind: Mapping[str, list[int]] | None = None,
              leases: Mapping[str, Mapping[str, float]] | None = None) -> Claim | Stale:
        """Take the lease of the run at ``seq`` (the one claim statement), or say why not."""
        ...

    def heartbeat(self, claim: Claim) -> bool:
        """Extend the lease; CancelRequested once an operator asked to cancel."""
        ...

    def commit(self, claim: Claim, advance: Advance, *,
               successor: Successor | None = None) -> bool | Claim:
        """The one commit statement: checkpoint ``seq + 1``, outbox row, lease released; with
        ``successor``, the next step claimed for it instead of its outbox row (the Claim)."""
        ...

    def commit_refused(self, claim: Claim) -> None:
        """Count a step whose result was discarded because its lease was lost."""
        ...

    def fail(self, claim: Claim, step: str, error: dict[str, Any], *,
             retry_in_s: float | None) -> bool:
        """Record a step error and retry the step after ``retry_in_s``."""
        ...

    def fail_run(self, claim: Claim, step: str, error: dict[str, Any]) -> Ended:
        """Fail the run for good, unless an effect's outcome is unknown."""
        ...

    def end_cancelled(self, claim: Claim, step: str | None) -> Ended:
        """End the run ``cancelled``, unless an effect's outcome is unknown."""
        ...

    def park(self, claim: Claim, step: str | None, reason: ParkReason,
             error: dict[str, Any]) -> bool:
        """Park the run for review (``needs_review``) with its reason."""
        ...

    def release(self, claim: Claim, error: dict[str, Any], *,
                resend_in_s: float | None = None, spend_attempt: bool = False) -> bool:
        """Give the lease back, the run unchanged, for other code to take it."""
        ...

    def hand_back(self, claim: Claim, error: dict[str, Any], *, delay_s: float,
                  park: bool, unbind: bool = False,
                  bind_to: tuple[int, int] | None = None) -> bool:
        """Give a run whose workflow or version this worker lacks back to the fleet (or
        park it); ``unbind`` undoes the binding of a new run the claim bound (binding it to
        ``bind_to``'s version and schema instead, when given)."""
        ...

    def defer(self, claim: Claim, step: str, *, delay_s: float, waiting_on: str,
              detail: str) -> bool:
        """Run the same step again after ``delay_s`` (an accepted effect is polled)."""
        ...

    def diverge(self, claim: Claim, step: str, report: dict[str, Any]) -> bool:
        """Stop an evidence replay that diverged from its parent, with its report."""
        ...
