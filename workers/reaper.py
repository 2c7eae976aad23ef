"""The reaper: restores runs whose worker is gone and parks crash loops (docs/design.md
section 7)."""

from __future__ import annotations

import threading

import structlog

from ledger.checkpoints import CheckpointKeys
from ledger.db import create_engine, require_current_schema
from ledger.exceptions import LedgerUnavailable
from ledger.recovery import RecoveryStore, SweepReport
from ledger.settings import OnwardSettings
from workers.dispatcher import install_stop_signals

log = structlog.get_logger("onward.reaper")


class Reaper:
    def __init__(self, settings: OnwardSettings) -> None:
        self.settings = settings
        self.store = RecoveryStore(create_engine(settings, pool_size=1),
                                   CheckpointKeys.from_settings(settings))
        self.stopping = threading.Event()

    def sweep_once(self) -> SweepReport:
        sealed = self.store.seal_audit()
        for refused in sealed.refused:
            log.error("audit chain not extended: it does not verify", detail=refused)
        report = self.store.sweep(stall_after_s=self.settings.stall_after_s)
        if report.total:
            log.warning("reaper acted", requeued=report.requeued, parked=report.parked,
                        stalled_resent=report.stalled_resent,
                        approvals_expired=report.waits.approvals_expired,
                        signal_timeouts=report.waits.signal_timeouts,
                        deadlines=report.waits.deadlines,
                        signals_delivered=report.waits.signals_delivered)
        return report

    def run(self) -> None:
        log.info("reaper started", interval_s=self.settings.reaper_interval_s,
                 lease_ttl_s=self.settings.lease_ttl_s)
        while not self.stopping.is_set():
            try:
                self.sweep_once()
            except LedgerUnavailable as exc:
                log.error("ledger unavailable; retrying", error=str(exc))
            self.stopping.wait(self.settings.reaper_interval_s)
        log.info("reaper stopped")


def run_reaper(settings: OnwardSettings) -> None:
    require_current_schema(create_engine(settings))
    reaper = Reaper(settings)
    install_stop_signals(reaper.stopping)
    reaper.run()
