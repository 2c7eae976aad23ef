"""approvals, signals, budgets, wait control

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def _replace_check(table: str, name: str, condition: str) -> None:
    op.drop_constraint(name, table, schema="onward")
    op.create_check_constraint(op.f(name), table, condition, schema="onward")


RUN_STATUSES = "'running', 'completed', 'failed', 'needs_review', 'cancelled'"
OUTCOMES = "'start', 'goto', 'finish', 'fail'"


def upgrade() -> None:
    op.create_table('approvals',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('run_id', sa.UUID(), nullable=False),
    sa.Column('tenant_id', sa.Text(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('workflow_version', sa.Integer(), nullable=False),
    sa.Column('step', sa.Text(), nullable=False),
    sa.Column('action', sa.Text(), nullable=False),
    sa.Column('artifact_hash', sa.Text(), nullable=False),
    sa.Column('artifact', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('approvers', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('decided_by', sa.Text(), nullable=True),
    sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('comment', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("status IN ('pending', 'approved', 'rejected', 'expired', 'invalidated')", name=op.f('ck_approvals_status')),
    sa.ForeignKeyConstraint(['run_id'], ['onward.runs.id'], name=op.f('fk_approvals_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_approvals')),
    schema='onward'
    )
    op.create_index('ix_approvals_pending_expiry', 'approvals', ['expires_at'], unique=False, schema='onward', postgresql_where=sa.text("status = 'pending'"))
    op.create_index('ix_approvals_run', 'approvals', ['run_id', 'seq'], unique=False, schema='onward')
    op.create_table('signals',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.UUID(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('consumed_seq', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['onward.runs.id'], name=op.f('fk_signals_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_signals')),
    schema='onward'
    )
    op.create_index('ix_signals_run_name', 'signals', ['run_id', 'name', 'consumed_seq'], unique=False, schema='onward')
    op.add_column('checkpoints', sa.Column('control', postgresql.JSONB(astext_type=sa.Text()), nullable=True), schema='onward')
    op.add_column('runs', sa.Column('wait_until', sa.DateTime(timezone=True), nullable=True), schema='onward')
    op.add_column('runs', sa.Column('budget_attempts', sa.Integer(), nullable=True), schema='onward')
    op.add_column('runs', sa.Column('budget_tokens', sa.Integer(), nullable=True), schema='onward')
    op.add_column('runs', sa.Column('budget_cost_usd', sa.Numeric(precision=12, scale=6), nullable=True), schema='onward')
    op.add_column('runs', sa.Column('deadline_at', sa.DateTime(timezone=True), nullable=True), schema='onward')
    op.add_column('runs', sa.Column('used_tokens', sa.Integer(), server_default=sa.text('0'), nullable=False), schema='onward')
    op.add_column('runs', sa.Column('used_cost_usd', sa.Numeric(precision=12, scale=6), server_default=sa.text('0'), nullable=False), schema='onward')
    op.create_index('ix_runs_wait_until', 'runs', ['wait_until'], unique=False, schema='onward', postgresql_where=sa.text('wait_until IS NOT NULL'))

    _replace_check("runs", "ck_runs_status", f"status IN ({RUN_STATUSES}, 'waiting')")
    _replace_check("checkpoints", "ck_checkpoints_outcome", f"outcome IN ({OUTCOMES}, 'wait')")

def downgrade() -> None:
    _replace_check("runs", "ck_runs_status", f"status IN ({RUN_STATUSES})")
    _replace_check("checkpoints", "ck_checkpoints_outcome", f"outcome IN ({OUTCOMES})")
    op.drop_index('ix_runs_wait_until', table_name='runs', schema='onward', postgresql_where=sa.text('wait_until IS NOT NULL'))
    op.drop_column('runs', 'used_cost_usd', schema='onward')
    op.drop_column('runs', 'used_tokens', schema='onward')
    op.drop_column('runs', 'deadline_at', schema='onward')
    op.drop_column('runs', 'budget_cost_usd', schema='onward')
    op.drop_column('runs', 'budget_tokens', schema='onward')
    op.drop_column('runs', 'budget_attempts', schema='onward')
    op.drop_column('runs', 'wait_until', schema='onward')
    op.drop_column('checkpoints', 'control', schema='onward')
    op.drop_index('ix_signals_run_name', table_name='signals', schema='onward')
    op.drop_table('signals', schema='onward')
    op.drop_index('ix_approvals_run', table_name='approvals', schema='onward')
    op.drop_index('ix_approvals_pending_expiry', table_name='approvals', schema='onward', postgresql_where=sa.text("status = 'pending'"))
    op.drop_table('approvals', schema='onward')
