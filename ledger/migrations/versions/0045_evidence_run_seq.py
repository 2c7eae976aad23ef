"""evidence by (run_id, seq): a claim's "already answered at this seq?" reads one entry

Revision ID: 0045
Revises: 0044

The claim statement (ledger/sql/steps.sql ``claim``) says whether an earlier attempt recorded
an answer at the claimed seq, so that the step's first model call or read can skip its
look-up. Evidence's primary key is (run_id, command_id): that check read every evidence row
of the run and filtered on seq, so a claim cost grew with the run's model calls (an agent
run of a thousand calls read a thousand rows per claim). This index answers it from one
entry; it costs one more index entry per recorded answer.
"""

from __future__ import annotations

from alembic import op

revision = '0045'
down_revision = '0044'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_evidence_run_seq', 'evidence', ['run_id', 'seq'], schema='onward')


def downgrade() -> None:
    op.drop_index('ix_evidence_run_seq', table_name='evidence', schema='onward')
