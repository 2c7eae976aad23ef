"""Bulk synthetic history for benchmarks (bench/console.py): plain INSERT … SELECT from
``generate_series``, so a ledger of 100,000 runs fills in seconds. The rows are shaped like
real ones for the console's reads; their checkpoint MACs are placeholders and do not verify.
Never point this at a database that holds real runs."""

from __future__ import annotations

from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection

# run ids are uuid7-shaped (time-ordered): a millisecond prefix, then the row number
_RUN_ID = ("(lpad(to_hex((extract(epoch FROM onward.now()) * 1000)::bigint - :n + g), 12, '0') "
           "|| '7000' || '8' || lpad(to_hex(g), 15, '0'))::uuid")

_RUNS = f"""
INSERT INTO onward.runs (id, tenant_id, workflow, workflow_version, status, seq, step,
                         max_attempts, head_hash, attempts_total, created_at, updated_at,
                         finished_at)
SELECT {_RUN_ID}, :tenant,
       CASE WHEN g % 3 = 0 THEN 'research_agent' ELSE 'sales_offer_agent' END, 1 + g % 2,
       CASE WHEN g % 50 = 0 THEN 'needs_review' WHEN g % 7 = 0 THEN 'failed'
            WHEN g % 11 = 0 THEN 'running' ELSE 'completed' END,
       5, NULL, 3, 'bench', 5, onward.now() - make_interval(secs => :n - g),
       onward.now(), onward.now()
  FROM generate_series(1, :n) AS g
"""

_APPROVALS = """
WITH waiting AS (
    UPDATE onward.runs SET status = 'waiting', waiting_on = 'approval:bench', finished_at = NULL
     WHERE id IN (SELECT id FROM onward.runs WHERE tenant_id = :tenant
                   ORDER BY id DESC LIMIT :n)
 RETURNING id, seq, created_at
)
INSERT INTO onward.approvals (id, run_id, tenant_id, seq, workflow_version, step, action,
                              artifact_hash, artifact, approvers, expires_at, status,
                              created_at)
SELECT gen_random_uuid(), id, :tenant, seq, 1, 'ask', 'send_offer', repeat('a', 64),
       jsonb_build_object('customer', 'c-' || left(id::text, 8), 'amount', 1000),
       '["role:sales_lead"]'::jsonb, onward.now() + interval '7 days', 'pending', created_at
  FROM waiting
"""

_LONG_RUN = """
WITH run AS (
    INSERT INTO onward.runs (id, tenant_id, workflow, workflow_version, status, seq, step,
                             max_attempts, head_hash, attempts_total, created_at, updated_at)
    VALUES (:run_id, :tenant, 'long_agent', 1, 'running', :steps, 'loop', 3, 'bench',
            :steps, onward.now() - interval '1 hour', onward.now())
    RETURNING id
), cps AS (
    INSERT INTO onward.checkpoints (run_id, seq, parent_hash, hash, key_id, envelope_version,
                                    step, next_step, outcome, state, workflow_version,
                                    lease_epoch, created_at)
    SELECT (SELECT id FROM run), g, CASE WHEN g > 0 THEN 'h' || (g - 1) END, 'h' || g,
           'bench', 1, CASE WHEN g > 0 THEN 'loop' END, 'loop',
           CASE WHEN g = 0 THEN 'start' ELSE 'goto' END,
           jsonb_build_object('i', g, 'notes', repeat('x', 200)), 1, g,
           onward.now() - make_interval(secs => :steps - g)
      FROM generate_series(0, :steps) AS g
)
INSERT INTO onward.step_attempts (run_id, lease_epoch, seq, attempt, step, worker,
                                  started_at, ended_at, outcome)
SELECT (SELECT id FROM run), g, g - 1, 1, 'loop', 'bench-worker:' || (g % 4),
       onward.now() - make_interval(secs => :steps - g),
       onward.now() - make_interval(secs => :steps - g) + interval '12 milliseconds',
       'committed'
  FROM generate_series(1, :steps) AS g
"""


def fill_runs_txn(conn: Connection, tenant_id: str, count: int) -> None:
    """``count`` runs of two workflows in a mix of statuses, newest last."""
    conn.execute(sa.text(_RUNS), {"tenant": tenant_id, "n": count})


def fill_approvals_txn(conn: Connection, tenant_id: str, count: int) -> None:
    """The newest ``count`` runs wait, each for one pending approval."""
    conn.execute(sa.text(_APPROVALS), {"tenant": tenant_id, "n": count})


def fill_long_run_txn(conn: Connection, tenant_id: str, run_id: UUID, steps: int) -> None:
    """One run with ``steps`` committed steps (checkpoints and step executions)."""
    conn.execute(sa.text(_LONG_RUN), {"tenant": tenant_id, "run_id": run_id, "steps": steps})
