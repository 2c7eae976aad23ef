"""Counts over a batch of runs, computed from the ledger alone (demo, tests, benchmarks)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection

_BATCH = sa.text("""
WITH r AS (SELECT * FROM onward.runs WHERE id = ANY(:ids)),
attempts AS (SELECT * FROM onward.step_attempts WHERE run_id = ANY(:ids)),
cps AS (SELECT * FROM onward.checkpoints WHERE run_id = ANY(:ids)),
per_run AS (SELECT run_id, count(*) AS n, max(seq) AS top FROM cps GROUP BY run_id)
SELECT
  (SELECT count(*) FROM r) AS runs,
  (SELECT count(*) FROM r WHERE status = 'completed') AS completed,
  (SELECT count(*) FROM r WHERE status = 'failed') AS failed,
  (SELECT count(*) FROM r WHERE status = 'needs_review') AS parked,
  (SELECT count(*) FROM cps WHERE seq > 0) AS steps_committed,
  (SELECT count(*) FROM (SELECT 1 FROM attempts WHERE outcome = 'committed'
                          GROUP BY run_id, seq HAVING count(*) > 1) d) AS duplicate_commits,
  (SELECT count(*) FROM attempts a JOIN cps c ON c.run_id = a.run_id AND c.seq = a.seq + 1
    WHERE a.started_at > c.created_at) AS completed_steps_reexecuted,
  (SELECT count(*) FROM attempts WHERE outcome IS DISTINCT FROM 'committed')
      AS uncommitted_attempts,
  -- a run at seq n has exactly the checkpoints 0..n (one per seq: UNIQUE (run_id, seq))
  (SELECT count(*) FROM r LEFT JOIN per_run p ON p.run_id = r.id
    WHERE coalesce(p.n, 0) <> r.seq + 1 OR p.top IS DISTINCT FROM r.seq) AS runs_with_gaps,
  (SELECT coalesce(sum(stale_deliveries), 0) FROM r) AS stale_deliveries,
  (SELECT coalesce(sum(restore_count), 0) FROM r) AS restores
""")


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
