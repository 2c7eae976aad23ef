"""evidence.request: a model call's or read's request, kept sealed beside its answer

Revision ID: 0046
Revises: 0045

With encryption keys configured, a recorded answer is sealed and the request that asked for
it was not kept at all (it would have been a shared, plain artifact): a replay whose call
asked something else could show only the two request hashes. The request is now kept
sealed in the evidence row, bound like the answer to the run's tenant, run, seq and field
(ledger/evidence.py ``request_field``), so a replay report can show its diff to a reader
allowed to see sealed values (``onward corpus replay --show-sealed``). NULL for evidence
recorded before this revision, on a ledger without keys (the request is the artifact its
hash names, as before), and once retention compacted the answer.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0046'
down_revision = '0045'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('evidence', sa.Column('request', postgresql.JSONB(), nullable=True),
                  schema='onward')


def downgrade() -> None:
    op.drop_column('evidence', 'request', schema='onward')
