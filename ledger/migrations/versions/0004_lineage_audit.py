"""lineage, audit, state schema versions

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def _replace_check(table: str, name: str, condition: str) -> None:
    op.drop_constraint(name, table, schema="onward")
    op.create_check_constraint(op.f(name), table, condition, schema="onward")


RUN_STATUSES = "'running', 'completed', 'failed', 'needs_review', 'cancelled', 'waiting'"
OUTCOMES = "'start', 'goto', 'finish', 'fail', 'wait'"
MODES = "'evidence', 'simulation', 'live', 'branch'"


def upgrade() -> None:
    op.create_table('audit',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('tenant_id', sa.Text(), nullable=False),
    sa.Column('actor', sa.Text(), nullable=False),
    sa.Column('role', sa.Text(), nullable=False),
    sa.Column('action', sa.Text(), nullable=False),
    sa.Column('outcome', sa.Text(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('run_id', sa.UUID(), nullable=True),
    sa.Column('new_run_id', sa.UUID(), nullable=True),
    sa.Column('effect_id', sa.Text(), nullable=True),
    sa.Column('approval_id', sa.UUID(), nullable=True),
    sa.Column('before_seq', sa.Integer(), nullable=True),
    sa.Column('after_seq', sa.Integer(), nullable=True),
    sa.Column('details', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit')),
    schema='onward'
    )
    op.create_index('ix_audit_at', 'audit', ['at'], unique=False, schema='onward')
    op.create_index('ix_audit_run', 'audit', ['run_id'], unique=False, schema='onward')
    op.add_column('checkpoints', sa.Column('state_schema_version', sa.Integer(), nullable=True), schema='onward')
    op.add_column('runs', sa.Column('state_schema_version', sa.Integer(), nullable=True), schema='onward')
    op.add_column('runs', sa.Column('parent_run_id', sa.UUID(), nullable=True), schema='onward')
    op.add_column('runs', sa.Column('parent_seq', sa.Integer(), nullable=True), schema='onward')
    op.add_column('runs', sa.Column('launch_reason', sa.Text(), nullable=True), schema='onward')
    op.add_column('runs', sa.Column('mode', sa.Text(), nullable=True), schema='onward')
    op.add_column('runs', sa.Column('allow_irreversible', sa.Boolean(), server_default=sa.text('false'), nullable=False), schema='onward')
    op.add_column('runs', sa.Column('branch_patch', postgresql.JSONB(astext_type=sa.Text()), nullable=True), schema='onward')
    op.create_index('ix_runs_parent', 'runs', ['parent_run_id'], unique=False, schema='onward', postgresql_where=sa.text('parent_run_id IS NOT NULL'))
    op.create_foreign_key(op.f('fk_runs_parent_run_id_runs'), 'runs', 'runs', ['parent_run_id'], ['id'], source_schema='onward', referent_schema='onward')

    _replace_check("runs", "ck_runs_status", f"status IN ({RUN_STATUSES}, 'diverged')")
    _replace_check("checkpoints", "ck_checkpoints_outcome",
                   f"outcome IN ({OUTCOMES}, 'migration', 'fork')")
    op.create_check_constraint(op.f("ck_runs_mode"), "runs", f"mode IS NULL OR mode IN ({MODES})",
                               schema="onward")

def downgrade() -> None:
    op.drop_constraint("ck_runs_mode", "runs", schema="onward")
    _replace_check("runs", "ck_runs_status", f"status IN ({RUN_STATUSES})")
    _replace_check("checkpoints", "ck_checkpoints_outcome", f"outcome IN ({OUTCOMES})")
    op.drop_constraint(op.f('fk_runs_parent_run_id_runs'), 'runs', schema='onward', type_='foreignkey')
    op.drop_index('ix_runs_parent', table_name='runs', schema='onward', postgresql_where=sa.text('parent_run_id IS NOT NULL'))
    op.drop_column('runs', 'branch_patch', schema='onward')
    op.drop_column('runs', 'allow_irreversible', schema='onward')
    op.drop_column('runs', 'mode', schema='onward')
    op.drop_column('runs', 'launch_reason', schema='onward')
    op.drop_column('runs', 'parent_seq', schema='onward')
    op.drop_column('runs', 'parent_run_id', schema='onward')
    op.drop_column('runs', 'state_schema_version', schema='onward')
    op.drop_column('checkpoints', 'state_schema_version', schema='onward')
    op.drop_index('ix_audit_run', table_name='audit', schema='onward')
    op.drop_index('ix_audit_at', table_name='audit', schema='onward')
    op.drop_table('audit', schema='onward')
