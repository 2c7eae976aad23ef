"""tokens: who may do what (hashed secrets, role, approver roles, tenant, expiry); audit rows
name the token the actor presented

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('tokens',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('token_hash', sa.Text(), nullable=False),
    sa.Column('actor', sa.Text(), nullable=False),
    sa.Column('role', sa.Text(), nullable=False),
    sa.Column('approver_roles', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('tenant_id', sa.Text(), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('created_by', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('onward.now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revoked_by', sa.Text(), nullable=True),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("role IN ('viewer', 'approver', 'operator', 'admin')", name=op.f('ck_tokens_role')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tokens')),
    schema='onward'
    )
    op.create_index('ix_tokens_hash', 'tokens', ['token_hash'], unique=True, schema='onward')
    op.add_column('audit', sa.Column('token_id', sa.UUID(), nullable=True), schema='onward')


def downgrade() -> None:
    op.drop_column('audit', 'token_id', schema='onward')
    op.drop_index('ix_tokens_hash', table_name='tokens', schema='onward')
    op.drop_table('tokens', schema='onward')
