"""initial ledger: runs, checkpoints, step attempts, outbox

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None

OUTBOX_NOTIFY_FUNCTION = """
CREATE OR REPLACE FUNCTION onward.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('onward_outbox', extract(epoch FROM NEW.due_at)::text);
    RETURN NULL;
END $$
"""
OUTBOX_NOTIFY_TRIGGER = """
CREATE TRIGGER outbox_notify AFTER INSERT OR UPDATE ON onward.outbox
FOR EACH ROW WHEN (NEW.published_at IS NULL AND NOT NEW.worker_publishes)
EXECUTE FUNCTION onward.outbox_notify()
"""


def upgrade() -> None:
    op.create_table('runs',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('tenant_id', sa.Text(), nullable=False),
    sa.Column('workflow', sa.Text(), nullable=False),
    sa.Column('workflow_version', sa.Integer(), nullable=True),
    sa.Column('conversation_id', sa.Text(), nullable=True),
    sa.Column('idempotency_key', sa.Text(), nullable=True),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('seq', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('step', sa.Text(), nullable=True),
    sa.Column('attempt', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('attempts_total', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('lease_owner', sa.Text(), nullable=True),
    sa.Column('lease_epoch', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('head_hash', sa.Text(), nullable=False),
    sa.Column('restore_count', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('stale_deliveries', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('last_error', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('parked_reason', sa.Text(), nullable=True),
    sa.Column('result', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('running', 'completed', 'failed', 'needs_review', 'cancelled')", name=op.f('ck_runs_status')),
    sa.CheckConstraint('seq >= 0', name=op.f('ck_runs_seq_nonnegative')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    schema='onward'
    )
    op.create_index('ix_runs_conversation', 'runs', ['conversation_id'], unique=False, schema='onward')
    op.create_index('ix_runs_status_lease', 'runs', ['status', 'lease_expires_at'], unique=False, schema='onward')
    op.create_index('ix_runs_tenant_idempotency', 'runs', ['tenant_id', 'idempotency_key'], unique=True, schema='onward', postgresql_where=sa.text('idempotency_key IS NOT NULL'))
    op.create_index('ix_runs_workflow_status', 'runs', ['workflow', 'status'], unique=False, schema='onward')
    op.create_table('checkpoints',
    sa.Column('run_id', sa.UUID(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('parent_hash', sa.Text(), nullable=True),
    sa.Column('hash', sa.Text(), nullable=False),
    sa.Column('key_id', sa.Text(), nullable=False),
    sa.Column('envelope_version', sa.Integer(), nullable=False),
    sa.Column('step', sa.Text(), nullable=True),
    sa.Column('next_step', sa.Text(), nullable=True),
    sa.Column('outcome', sa.Text(), nullable=False),
    sa.Column('state', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('workflow_version', sa.Integer(), nullable=True),
    sa.Column('lease_epoch', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("outcome IN ('start', 'goto', 'finish', 'fail')", name=op.f('ck_checkpoints_outcome')),
    sa.ForeignKeyConstraint(['run_id'], ['onward.runs.id'], name=op.f('fk_checkpoints_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'seq', name=op.f('pk_checkpoints')),
    schema='onward'
    )
    op.create_table('outbox',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.UUID(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('due_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('worker_publishes', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('published_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('publish_count', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['onward.runs.id'], name=op.f('fk_outbox_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_outbox')),
    sa.UniqueConstraint('run_id', 'seq', name=op.f('uq_outbox_run_id_seq')),
    schema='onward'
    )
    op.create_index('ix_outbox_due_at', 'outbox', ['due_at'], unique=False, schema='onward')
    # Rows the dispatcher must publish (not those a worker publishes itself) wake it at once.
    op.execute(OUTBOX_NOTIFY_FUNCTION)
    op.execute(OUTBOX_NOTIFY_TRIGGER)
    op.create_table('step_attempts',
    sa.Column('run_id', sa.UUID(), nullable=False),
    sa.Column('lease_epoch', sa.BigInteger(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('step', sa.Text(), nullable=True),
    sa.Column('worker', sa.Text(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('outcome', sa.Text(), nullable=True),
    sa.Column('error_type', sa.Text(), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.CheckConstraint("outcome IS NULL OR outcome IN ('committed', 'failed', 'lease_lost', 'released', 'parked', 'worker_lost')", name=op.f('ck_step_attempts_outcome')),
    sa.ForeignKeyConstraint(['run_id'], ['onward.runs.id'], name=op.f('fk_step_attempts_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'lease_epoch', name=op.f('pk_step_attempts')),
    schema='onward'
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS outbox_notify ON onward.outbox")
    op.execute("DROP FUNCTION IF EXISTS onward.outbox_notify()")
    op.drop_table('step_attempts', schema='onward')
    op.drop_index('ix_outbox_due_at', table_name='outbox', schema='onward')
    op.drop_table('outbox', schema='onward')
    op.drop_table('checkpoints', schema='onward')
    op.drop_index('ix_runs_workflow_status', table_name='runs', schema='onward')
    op.drop_index('ix_runs_tenant_idempotency', table_name='runs', schema='onward', postgresql_where=sa.text('idempotency_key IS NOT NULL'))
    op.drop_index('ix_runs_status_lease', table_name='runs', schema='onward')
    op.drop_index('ix_runs_conversation', table_name='runs', schema='onward')
    op.drop_table('runs', schema='onward')
