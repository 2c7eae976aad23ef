"""trace context: the W3C traceparent a run's trace started with (runs) and the one the step
that wrote a message had open (outbox), so a run is one trace across workers, broker hops
and waits (ledger/tracing.py); NULL when tracing is off

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('trace_context', sa.Text(), nullable=True), schema='onward')
    op.add_column('outbox', sa.Column('trace_context', sa.Text(), nullable=True),
                  schema='onward')


def downgrade() -> None:
    op.drop_column('outbox', 'trace_context', schema='onward')
    op.drop_column('runs', 'trace_context', schema='onward')
