"""corpora: named sets of recorded runs pinned as a regression suite (onward corpus); a
pinned run cannot be deleted while pinned, and retention must skip it

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('corpora',
    sa.Column('tenant_id', sa.Text(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('description', sa.Text(), nullable=True),
    sa.Column('created_by', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('onward.now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('onward.now()'), nullable=False),
    sa.PrimaryKeyConstraint('tenant_id', 'name', name=op.f('pk_corpora')),
    schema='onward'
    )
    op.create_table('corpus_runs',
    sa.Column('tenant_id', sa.Text(), nullable=False),
    sa.Column('corpus', sa.Text(), nullable=False),
    sa.Column('run_id', sa.UUID(), nullable=False),
    sa.Column('pinned_by', sa.Text(), nullable=False),
    sa.Column('pinned_at', sa.DateTime(timezone=True), server_default=sa.text('onward.now()'), nullable=False),
    sa.Column('selection', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['onward.runs.id'], name=op.f('fk_corpus_runs_run_id_runs')),
    sa.ForeignKeyConstraint(['tenant_id', 'corpus'], ['onward.corpora.tenant_id', 'onward.corpora.name'], name=op.f('fk_corpus_runs_tenant_id_corpora'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('tenant_id', 'corpus', 'run_id', name=op.f('pk_corpus_runs')),
    schema='onward'
    )
    op.create_index('ix_corpus_runs_run_id', 'corpus_runs', ['run_id'], unique=False, schema='onward')


def downgrade() -> None:
    op.drop_index('ix_corpus_runs_run_id', table_name='corpus_runs', schema='onward')
    op.drop_table('corpus_runs', schema='onward')
    op.drop_table('corpora', schema='onward')
