"""fleet: the workers that advertise themselves (host, pid, pool, concurrency, queues,
workflows, steps in flight, heartbeat) for `onward workers`; the start step of each
advertised workflow version, so a dispatcher names a run's first message by its step

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('worker_queues', sa.Column('start_step', sa.Text(), nullable=True),
                  schema='onward')
    op.create_table('workers',
    sa.Column('node', sa.Text(), nullable=False),
    sa.Column('host', sa.Text(), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('pool', sa.Text(), nullable=False),
    sa.Column('concurrency', sa.Integer(), nullable=False),
    sa.Column('queues', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('workflows', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('in_flight', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('onward.now()'), nullable=False),
    sa.Column('seen_at', sa.DateTime(timezone=True), server_default=sa.text('onward.now()'), nullable=False),
    sa.PrimaryKeyConstraint('node', name=op.f('pk_workers')),
    schema='onward'
    )
    op.create_index('ix_workers_seen_at', 'workers', ['seen_at'], schema='onward')


def downgrade() -> None:
    op.drop_index('ix_workers_seen_at', table_name='workers', schema='onward')
    op.drop_table('workers', schema='onward')
    op.drop_column('worker_queues', 'start_step', schema='onward')
