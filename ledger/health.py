"""Numbers about the whole ledger for monitoring (docs/design.md section 11), one query each.

Everything here is read from PostgreSQL, the source of truth, so one exporter process can
serve a fleet of any size and nothing is lost when a worker dies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection

_SNAPSHOT = sa.text("""
SELECT
  (SELECT coalesce(jsonb_object_agg(status, n), '{}'::jsonb)
     FROM (SELECT status, count(*) AS n FROM onward.runs GROUP BY status) s) AS runs_by_status,
  (SELECT coalesce(jsonb_object_agg(coalesce(outcome, 'running'), n), '{}'::jsonb)
     FROM (SELECT outcome, count(*) AS n FROM onward.step_attempts GROUP BY outcome) a)
     AS attempts_by_outcome,
  (SELECT coalesce(sum(stale_deliveries), 0) FROM onward.runs) AS stale_deliveries,
  (SELECT coalesce(sum(restore_count), 0) FROM onward.runs) AS restores,
  (SELECT coalesce(extract(epoch FROM onward.now() - min(c.created_at)), 0)
     FROM onward.runs r JOIN onward.checkpoints c ON c.run_id = r.id AND c.seq = r.seq
    WHERE r.status IN ('running', 'waiting')) AS oldest_active_checkpoint_age_s,
  (SELECT count(*) FROM onward.effects WHERE status IN ('pending', 'accepted'))
     AS unresolved_effects,
  (SELECT coalesce(extract(epoch FROM onward.now() - min(updated_at)), 0) FROM onward.effects
    WHERE status IN ('pending', 'accepted')) AS oldest_unresolved_effect_age_s,
  (SELECT count(*) FROM onward.outbox WHERE due_at <= onward.now()) AS outbox_due,
  (SELECT coalesce(extract(epoch FROM onward.now() - min(due_at)), 0) FROM onward.outbox
    WHERE due_at <= onward.now() AND published_at IS NULL AND NOT worker_publishes)
     AS outbox_lag_s,
  (SELECT count(*) FROM onward.approvals WHERE status = 'pending') AS pending_approvals
""")

_LATENCY = sa.text("""
SELECT percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM ended_at - started_at)) AS q, count(*) AS n
  FROM onward.step_attempts
 WHERE outcome = 'committed' AND ended_at > onward.now() - :window * interval '1 second'
""")


@dataclass(frozen=True)
class Health:
    runs_by_status: dict[str, int]
    attempts_by_outcome: dict[str, int]
    stale_deliveries: int
    restores: int
    oldest_active_checkpoint_age_s: float
    unresolved_effects: int
    oldest_unresolved_effect_age_s: float
    outbox_due: int
    outbox_lag_s: float
    pending_approvals: int
    step_seconds: dict[float, float] = field(default_factory=dict)  # quantile -> seconds
    steps_in_window: int = 0


def health_txn(conn: Connection, *, latency_window_s: float = 300.0) -> Health:
    row = conn.execute(_SNAPSHOT).mappings().one()
    latency = conn.execute(_LATENCY, {"window": latency_window_s}).mappings().one()
    quantiles = latency["q"] or []
    return Health(
        runs_by_status={k: int(v) for k, v in row["runs_by_status"].items()},
        attempts_by_outcome={k: int(v) for k, v in row["attempts_by_outcome"].items()},
        stale_deliveries=int(row["stale_deliveries"]),
        restores=int(row["restores"]),
        oldest_active_checkpoint_age_s=float(row["oldest_active_checkpoint_age_s"]),
        unresolved_effects=int(row["unresolved_effects"]),
        oldest_unresolved_effect_age_s=float(row["oldest_unresolved_effect_age_s"]),
        outbox_due=int(row["outbox_due"]),
        outbox_lag_s=float(row["outbox_lag_s"]),
        pending_approvals=int(row["pending_approvals"]),
        step_seconds={q: float(v) for q, v in zip((0.5, 0.9, 0.99), quantiles, strict=False)
                      if v is not None},
        steps_in_window=int(latency["n"]),
    )
