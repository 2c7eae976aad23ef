"""The step's clock: the database's time, read by the claim and advanced on this host's
monotonic clock (docs/design.md section 13, invariant 7, "one clock").

Every time a step hands to the ledger (a timer's wake-up, an approval's expiry, a signal's
timeout, an effect's age, a replay's due time) is compared there with ``onward.now()``, so
it is computed from ``Claim.claimed_at`` (that statement's ``onward.now()``) plus the time
elapsed since, never from this host's wall clock, which may be off by any amount.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

__all__ = ["StepClock"]


@dataclass(frozen=True)
class StepClock:
    claimed_at: datetime  # onward.now() of the claim statement (aware)
    _started: float = field(default_factory=time.monotonic, repr=False)

    def now(self) -> datetime:
        """The database's time now, as far as this step can know it without asking."""
        return self.claimed_at + timedelta(seconds=time.monotonic() - self._started)
