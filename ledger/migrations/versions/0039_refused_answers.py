"""an answer the ledger could not record is kept as a refusal: refused_answers

Revision ID: 0039
Revises: 0038

A model answer or read result that cannot be recorded as evidence (a NUL character, nested
too deeply, too large) was debited and the run failed at the next commit, in two
statements: a worker killed between them left nothing that said the call was made, and the
retried step called (and paid) again (issue 10, F9). The debit now records the refusal in
the same statement: the call, the answer's sha256 and size when they can be taken (never
its bytes), the reason and what it cost. A retried attempt that finds it fails the step
again without calling; ``onward runs continue`` of a run failed ``invalid_answer`` clears
it (``cleared_at``), so the continued step asks again, as a person decided. Rows of a run,
protected like migration 0032's.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0039'
down_revision = '0038'
branch_labels = None
depends_on = None

TABLE = "refused_answers"


def upgrade() -> None:
    op.create_table(TABLE,
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.UUID(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('command_id', sa.Text(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('request_hash', sa.Text(), nullable=False),
    sa.Column('answer_sha256', sa.Text(), nullable=True),
    sa.Column('answer_bytes', sa.BigInteger(), nullable=True),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('input_tokens', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('output_tokens', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('cost_usd', sa.Numeric(precision=12, scale=6), server_default=sa.text('0'), nullable=False),
    sa.Column('lease_epoch', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('onward.now()'), nullable=False),
    sa.Column('cleared_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['onward.runs.id'], name=op.f('fk_refused_answers_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_refused_answers')),
    schema='onward'
    )
    op.create_index('ix_refused_answers_standing', TABLE, ['run_id', 'command_id'],
                    unique=True, schema='onward',
                    postgresql_where=sa.text('cleared_at IS NULL'))
    op.execute(f"ALTER TABLE onward.{TABLE} ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE onward.{TABLE} FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant ON onward.{TABLE} "
               f"USING (EXISTS (SELECT 1 FROM onward.runs r WHERE r.id = {TABLE}.run_id)) "
               "WITH CHECK (onward.visible_run(run_id))")
    op.execute(f"CREATE POLICY operator ON onward.{TABLE} TO onward_operator "
               "USING (true) WITH CHECK (true)")


def downgrade() -> None:
    op.execute(f"DROP POLICY IF EXISTS tenant ON onward.{TABLE}")
    op.execute(f"DROP POLICY IF EXISTS operator ON onward.{TABLE}")
    op.drop_index('ix_refused_answers_standing', table_name=TABLE, schema='onward')
    op.drop_table(TABLE, schema='onward')
