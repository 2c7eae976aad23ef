"""The reaper: restores runs whose worker is gone and parks crash loops (docs/design.md
section 7)."""

from __future__ import annotations

import threading
import time

import structlog

from ledger import partitions, retention
from ledger.anchor_store import open_store
from ledger.anchoring import Anchorer
from ledger.checkpoints import CheckpointKeys
from ledger.db import RevisionWatch, create_engine, database_url
from ledger.exceptions import LedgerUnavailable, OnwardError, RollbackFound
from ledger.recovery import RecoveryStore, SweepReport
from workers.dispatcher import install_stop_signals
from workers.revision import wait_for_ledger
from workers.settings import WorkerSettings

__all__ = ["Reaper", "run_reaper"]


log = structlog.get_logger("onward.reaper")


class Reaper:
    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        engine = create_engine(settings, pool_size=1)
        keys = CheckpointKeys.from_settings(settings)
        self.store = RecoveryStore(engine, keys)
        self.anchorer = (Anchorer(engine, keys, open_store(settings.anchor_location),
                                  settings.anchor_interval_s)
                         if settings.anchor_location else None)
        self.engine, self.keys = engine, keys
        self.policies = retention.parse_policies(settings.retention_policies)
        self._retention_due = 0.0  # time.monotonic()
        self._partitions_due = 0.0  # time.monotonic()
        self.stopping = threading.Event()
        self.revision = RevisionWatch(database_url(settings), settings.schema_check_s)

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
        self.anchor_if_due()
        self.partitions_if_due()
        self.retention_if_due()
        return report

    def partitions_if_due(self) -> None:
        """Every ONWARD_RETENTION_INTERVAL_S: make the next months' partitions of the tables
        partitioned by time (ledger/partitions.py), whatever the policies, and drop the
        ended months the policies let go of entirely (audited)."""
        if time.monotonic() < self._partitions_due:
            return
        try:
            made = partitions.ensure(self.engine)
            expired = partitions.expire(self.engine, self.keys, self.policies)
        except LedgerUnavailable:
            raise  # retried at the next sweep (a drop that waited too long for its lock too)
        except OnwardError as exc:
            self._partitions_due = time.monotonic() + self.settings.retention_interval_s
            log.error("partitions not maintained", error=str(exc))
            return
        self._partitions_due = time.monotonic() + self.settings.retention_interval_s
        if made or expired.dropped:
            log.warning("partitions", created=made, dropped=expired.dropped,
                        rows_dropped=expired.rows)

    def retention_if_due(self) -> None:
        """Apply ONWARD_RETENTION_POLICIES every ONWARD_RETENTION_INTERVAL_S, a bounded
        number of runs at a time (the next sweep goes on where this one stopped)."""
        if not self.policies or time.monotonic() < self._retention_due:
            return
        done = retention.apply(self.engine, self.keys, self.policies, max_runs=500,
                               tenant=self.settings.tenant_id)
        if done.runs < 500:
            self._retention_due = time.monotonic() + self.settings.retention_interval_s
        if done.runs or done.refused or done.artifacts:
            log.warning("retention compacted runs", runs=done.runs,
                        checkpoints=done.checkpoints, artifacts=done.artifacts,
                        artifact_bytes=done.artifact_bytes, kept_unverified=done.refused[:5])

    def anchor_if_due(self) -> None:
        """Write an anchor every ONWARD_ANCHOR_INTERVAL_S (ledger/anchoring.py); a ledger
        that moved back since the latest anchor is logged, and not anchored."""
        if self.anchorer is None:
            return
        try:
            done = self.anchorer.run_if_due()
        except RollbackFound as exc:
            log.error("not anchored: the ledger moved back since the latest anchor",
                      detail=str(exc), runs=[str(p.run_id) for p in exc.problems[:20]])
            return
        except LedgerUnavailable:
            raise
        except OnwardError as exc:
            log.error("anchor not written", error=str(exc))
            return
        if done is not None:
            log.info("anchor written", anchor=done.where, runs=done.runs, root=done.root,
                     bytes=done.size)
            if done.not_anchored:
                log.error("heads left out of the anchor: their MAC does not verify "
                          "(onward verify RUN)", runs=[str(r) for r in done.not_anchored[:20]],
                          count=len(done.not_anchored))

    def run(self) -> None:
        log.info("reaper started", interval_s=self.settings.reaper_interval_s,
                 lease_ttl_s=self.settings.lease_ttl_s)
        while not self.stopping.is_set():
            self.revision.check()  # an upgrade ran: SchemaMismatch stops the reaper
            try:
                self.sweep_once()
            except LedgerUnavailable as exc:
                log.error("ledger unavailable; retrying", error=str(exc))
            self.stopping.wait(self.settings.reaper_interval_s)
        log.info("reaper stopped")


def run_reaper(settings: WorkerSettings) -> None:
    wait_for_ledger(create_engine(settings), "reaper")
    reaper = Reaper(settings)
    install_stop_signals(reaper.stopping)
    reaper.run()
