"""effects, effect attempts, evidence, artifacts

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('artifacts',
    sa.Column('sha256', sa.Text(), nullable=False),
    sa.Column('size', sa.Integer(), nullable=False),
    sa.Column('media_type', sa.Text(), nullable=False),
    sa.Column('body', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('sha256', name=op.f('pk_artifacts')),
    schema='onward'
    )
    op.create_table('effects',
    sa.Column('effect_id', sa.Text(), nullable=False),
    sa.Column('effect_type', sa.Text(), nullable=False),
    sa.Column('run_id', sa.UUID(), nullable=False),
    sa.Column('tenant_id', sa.Text(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('step', sa.Text(), nullable=False),
    sa.Column('command_id', sa.Text(), nullable=False),
    sa.Column('tool_class', sa.Text(), nullable=False),
    sa.Column('request_hash', sa.Text(), nullable=False),
    sa.Column('recipient', sa.Text(), nullable=True),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('provider_ref', sa.Text(), nullable=True),
    sa.Column('result', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('error', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('reconciled', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('polls', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('pending', 'accepted', 'completed', 'failed')", name=op.f('ck_effects_status')),
    sa.CheckConstraint("tool_class IN ('read', 'idempotent_write', 'irreversible')", name=op.f('ck_effects_tool_class')),
    sa.ForeignKeyConstraint(['run_id'], ['onward.runs.id'], name=op.f('fk_effects_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('effect_type', 'effect_id', name=op.f('pk_effects')),
    schema='onward'
    )
    op.create_index('ix_effects_run', 'effects', ['run_id', 'seq'], unique=False, schema='onward')
    op.create_index('ix_effects_status_updated', 'effects', ['status', 'updated_at'], unique=False, schema='onward')
    op.create_table('evidence',
    sa.Column('run_id', sa.UUID(), nullable=False),
    sa.Column('command_id', sa.Text(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('step', sa.Text(), nullable=False),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('source_version', sa.Text(), nullable=True),
    sa.Column('request_hash', sa.Text(), nullable=False),
    sa.Column('response', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('artifact_sha256', sa.Text(), nullable=True),
    sa.Column('input_tokens', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('output_tokens', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('cost_usd', sa.Numeric(precision=12, scale=6), server_default=sa.text('0'), nullable=False),
    sa.Column('lease_epoch', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("kind IN ('llm', 'read')", name=op.f('ck_evidence_kind')),
    sa.CheckConstraint('(response IS NULL) <> (artifact_sha256 IS NULL)', name=op.f('ck_evidence_one_body')),
    sa.ForeignKeyConstraint(['artifact_sha256'], ['onward.artifacts.sha256'], name=op.f('fk_evidence_artifact_sha256_artifacts')),
    sa.ForeignKeyConstraint(['run_id'], ['onward.runs.id'], name=op.f('fk_evidence_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'command_id', name=op.f('pk_evidence')),
    schema='onward'
    )
    op.create_table('effect_attempts',
    sa.Column('effect_type', sa.Text(), nullable=False),
    sa.Column('effect_id', sa.Text(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('worker', sa.Text(), nullable=False),
    sa.Column('lease_epoch', sa.BigInteger(), nullable=True),
    sa.Column('idempotency_key', sa.Text(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('outcome', sa.Text(), nullable=True),
    sa.Column('provider_ref', sa.Text(), nullable=True),
    sa.Column('error', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.CheckConstraint("kind IN ('call', 'lookup', 'status', 'repeat')", name=op.f('ck_effect_attempts_kind')),
    sa.ForeignKeyConstraint(['effect_type', 'effect_id'], ['onward.effects.effect_type', 'onward.effects.effect_id'], name=op.f('fk_effect_attempts_effect_type_effects'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('effect_type', 'effect_id', 'attempt', name=op.f('pk_effect_attempts')),
    schema='onward'
    )
    op.add_column('runs', sa.Column('waiting_on', sa.Text(), nullable=True), schema='onward')

    op.drop_constraint("ck_step_attempts_outcome", "step_attempts", schema="onward")
    op.create_check_constraint(
        op.f("ck_step_attempts_outcome"), "step_attempts",
        "outcome IS NULL OR outcome IN ('committed', 'failed', 'lease_lost', 'released', "
        "'parked', 'worker_lost', 'waiting')",
        schema="onward",
    )

def downgrade() -> None:
    op.drop_constraint("ck_step_attempts_outcome", "step_attempts", schema="onward")
    op.create_check_constraint(
        op.f("ck_step_attempts_outcome"), "step_attempts",
        "outcome IS NULL OR outcome IN ('committed', 'failed', 'lease_lost', 'released', "
        "'parked', 'worker_lost')",
        schema="onward",
    )
    op.drop_column('runs', 'waiting_on', schema='onward')
    op.drop_table('effect_attempts', schema='onward')
    op.drop_table('evidence', schema='onward')
    op.drop_index('ix_effects_status_updated', table_name='effects', schema='onward')
    op.drop_index('ix_effects_run', table_name='effects', schema='onward')
    op.drop_table('effects', schema='onward')
    op.drop_table('artifacts', schema='onward')
