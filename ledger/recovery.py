"""What the reaper does: expired leases, stalled runs, crash loops (docs/design.md section 7).

Every statement takes its runs with FOR UPDATE SKIP LOCKED, so several reapers can run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.engine import Engine

from ledger import sql
from ledger.audit_chain import Sealed, seal_txn
from ledger.checkpoints import CheckpointKeys
from ledger.db import wrap_driver_errors
from ledger.exceptions import OnwardError
from ledger.waits import WaitSweep, sweep_waits_txn

__all__ = ["RecoveryStore", "SweepReport"]


_REQUEUE_EXPIRED = sql.text("requeue_expired")
_PARK_EXHAUSTED = sql.text("park_exhausted")
_RESEND_STALLED = sql.text("resend_stalled")


@dataclass(frozen=True)
class SweepReport:
    requeued: int
    parked: int
    stalled_resent: int
    waits: WaitSweep = field(default_factory=lambda: WaitSweep(0, 0, 0))

    @property
    def total(self) -> int:
        return (self.requeued + self.parked + self.stalled_resent + self.waits.approvals_expired
                + self.waits.signal_timeouts + self.waits.deadlines
                + self.waits.signals_delivered)


class RecoveryStore:
    """The reaper's ledger operations."""

    def __init__(self, engine: Engine, keys: CheckpointKeys | None = None) -> None:
        self._engine = engine
        self._keys = keys

    def seal_audit(self, limit: int = 1000) -> Sealed:
        """Link newly written audit rows into their tenants' chains (ledger/audit_chain.py)."""
        if self._keys is None:
            raise OnwardError("sealing the audit log needs the checkpoint keys")
        with wrap_driver_errors("sealing the audit log"), self._engine.begin() as conn:
            return seal_txn(conn, self._keys, limit)

    def sweep(self, *, stall_after_s: float, limit: int = 500) -> SweepReport:
        with wrap_driver_errors("reaper sweep"), self._engine.begin() as conn:
            parked = conn.execute(_PARK_EXHAUSTED, {"limit": limit}).scalar_one()
            requeued = conn.execute(_REQUEUE_EXPIRED, {"limit": limit}).scalar_one()
            stalled = conn.execute(
                _RESEND_STALLED, {"stall_s": stall_after_s, "limit": limit}
            ).rowcount
        with wrap_driver_errors("reaper sweep of waits"), self._engine.begin() as conn:
            waited = sweep_waits_txn(conn, limit)
        return SweepReport(requeued=requeued, parked=parked, stalled_resent=stalled,
                           waits=waited)
