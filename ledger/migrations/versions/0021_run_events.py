"""run progress notifications and the state schemas workers advertise

Revision ID: 0021
Revises: 0020

A run whose ``seq`` or ``status`` changes NOTIFYs the channel ``onward_run_<id hex>`` with
``{"seq": …, "status": …}`` in the same transaction, so ``Ledger.wait`` and
``events(run_id)`` learn of a committed step or a stop without polling (a commit already
NOTIFYs the dispatcher's outbox channel; this adds one entry to the same queue). Workers
advertise the JSON Schema of each workflow version's state model, which ``start_run``
checks a new run's input against.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None

RUN_NOTIFY_FUNCTION = """
CREATE OR REPLACE FUNCTION onward.notify_run_progress() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('onward_run_' || replace(NEW.id::text, '-', ''),
                      json_build_object('seq', NEW.seq, 'status', NEW.status)::text);
    RETURN NULL;
END
$$
"""

RUN_NOTIFY_TRIGGER = """
CREATE TRIGGER runs_notify_progress AFTER UPDATE OF seq, status ON onward.runs
FOR EACH ROW WHEN (OLD.seq IS DISTINCT FROM NEW.seq OR OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION onward.notify_run_progress()
"""


def upgrade() -> None:
    op.execute(RUN_NOTIFY_FUNCTION)
    op.execute(RUN_NOTIFY_TRIGGER)
    op.add_column('worker_queues', sa.Column('state_schema', postgresql.JSONB(astext_type=sa.Text()), nullable=True), schema='onward')


def downgrade() -> None:
    op.drop_column('worker_queues', 'state_schema', schema='onward')
    op.execute("DROP TRIGGER IF EXISTS runs_notify_progress ON onward.runs")
    op.execute("DROP FUNCTION IF EXISTS onward.notify_run_progress()")
