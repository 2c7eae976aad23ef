"""Counts over a batch of runs, computed from the ledger alone (demo, tests, benchmarks)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from uuid import UUID

from sqlalchemy.engine import Connection

from ledger import sql

__all__ = ["BatchStats", "batch_stats"]


_BATCH = sql.text("batch_stats")


@dataclass(frozen=True)
class BatchStats:
    runs: int
    completed: int
    failed: int
    parked: int
    steps_committed: int
    duplicate_commits: int
    completed_steps_reexecuted: int
    uncommitted_attempts: int
    runs_with_gaps: int
    stale_deliveries: int
    restores: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def batch_stats(conn: Connection, run_ids: list[UUID]) -> BatchStats:
    row = conn.execute(_BATCH, {"ids": run_ids}).mappings().one()
    return BatchStats(**{name: int(row[name]) for name in BatchStats.__dataclass_fields__})
