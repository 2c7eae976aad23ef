"""metric totals: counters each worker process adds to every few seconds (steps committed,
step outcomes, duration histogram, stale deliveries), so a scrape reads a small table
instead of counting history; a partial index on step executions whose worker was lost
(restores)

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('metric_totals',
    sa.Column('workflow', sa.Text(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('metric', sa.Text(), nullable=False),
    sa.Column('label', sa.Text(), nullable=False),
    sa.Column('value', sa.Float(precision=53), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('onward.now()'), nullable=False),
    sa.PrimaryKeyConstraint('workflow', 'version', 'metric', 'label', name=op.f('pk_metric_totals')),
    schema='onward'
    )
    op.create_index('ix_step_attempts_worker_lost', 'step_attempts', ['run_id'], schema='onward',
                    postgresql_where=sa.text("outcome = 'worker_lost'"))


def downgrade() -> None:
    op.drop_index('ix_step_attempts_worker_lost', table_name='step_attempts', schema='onward',
                  postgresql_where=sa.text("outcome = 'worker_lost'"))
    op.drop_table('metric_totals', schema='onward')
