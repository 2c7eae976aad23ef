"""model and read spend is debited when the answer is recorded, not at commit

Revision ID: 0014
Revises: 0013

From this revision the statement that records evidence also adds its tokens and cost to
the run's ``used_tokens`` / ``used_cost_usd`` (ledger/evidence.py), and the commit no longer
does. Earlier revisions debited a step's spend only when it committed, so answers recorded
at a run's current seq (a step that failed, crashed or is being retried) were never
counted: they are added here, once. Workers of the previous revision refuse to start on
this one, so no spend is counted by both.
"""

from __future__ import annotations

from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

UNCOMMITTED_SPEND = """
UPDATE onward.runs r
   SET used_tokens = r.used_tokens + u.tokens, used_cost_usd = r.used_cost_usd + u.cost_usd
  FROM (SELECT e.run_id, sum(e.input_tokens + e.output_tokens) AS tokens,
               sum(e.cost_usd) AS cost_usd
          FROM onward.evidence e JOIN onward.runs o ON o.id = e.run_id
         WHERE e.seq >= o.seq
         GROUP BY e.run_id) u
 WHERE r.id = u.run_id
"""

COMMITTED_ONLY = """
UPDATE onward.runs r
   SET used_tokens = greatest(r.used_tokens - u.tokens, 0),
       used_cost_usd = greatest(r.used_cost_usd - u.cost_usd, 0)
  FROM (SELECT e.run_id, sum(e.input_tokens + e.output_tokens) AS tokens,
               sum(e.cost_usd) AS cost_usd
          FROM onward.evidence e JOIN onward.runs o ON o.id = e.run_id
         WHERE e.seq >= o.seq
         GROUP BY e.run_id) u
 WHERE r.id = u.run_id
"""


def upgrade() -> None:
    op.execute(UNCOMMITTED_SPEND)


def downgrade() -> None:
    op.execute(COMMITTED_ONLY)
