"""one clock: onward.now(), the database's time every comparison and default uses

Revision ID: 0007
Revises: 0006

``onward.now()`` is ``now()`` plus an offset read from the session setting
``onward.clock_offset`` (an interval). Production never sets it, so it is ``now()``; the
model-based tests set it to make time pass deterministically (docs/design.md, "One clock").
"""

from __future__ import annotations

from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

NOW_FUNCTION = """
CREATE OR REPLACE FUNCTION onward.now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT now() + coalesce(nullif(current_setting('onward.clock_offset', true), '')::interval,
                            interval '0')
$$
"""

# (table, column) of every timestamp whose default is "the time of this write"
DEFAULTED = [
    ("runs", "created_at"), ("runs", "updated_at"), ("checkpoints", "created_at"),
    ("step_attempts", "started_at"), ("outbox", "due_at"), ("outbox", "created_at"),
    ("effects", "created_at"), ("effects", "updated_at"), ("effect_attempts", "started_at"),
    ("artifacts", "created_at"), ("evidence", "created_at"), ("approvals", "created_at"),
    ("signals", "created_at"), ("audit", "at"), ("worker_queues", "seen_at"),
]


def upgrade() -> None:
    op.execute(NOW_FUNCTION)
    for table, column in DEFAULTED:
        op.execute(f"ALTER TABLE onward.{table} ALTER COLUMN {column} SET DEFAULT onward.now()")


def downgrade() -> None:
    for table, column in DEFAULTED:
        op.execute(f"ALTER TABLE onward.{table} ALTER COLUMN {column} SET DEFAULT now()")
    op.execute("DROP FUNCTION IF EXISTS onward.now()")
