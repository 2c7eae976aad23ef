"""runs updates on the hot path stay HOT: the lease is no longer indexed

Revision ID: 0040
Revises: 0039

``ix_runs_status_lease`` indexed ``(status, lease_expires_at)``. Every claim and every
commit changes ``lease_expires_at``, so no update of a running run could be a heap-only
(HOT) update: each wrote a new entry in every index of ``runs`` (seven for a plain run) and
their WAL. ``ix_runs_status`` indexes the status alone, which a step of a running run does
not change; the reaper finds expired leases among the running runs by filtering them
(docs/scaling.md). ``fillfactor`` 90 leaves room on each page for the new row version a HOT
update needs.
"""

from __future__ import annotations

from alembic import op

revision = '0040'
down_revision = '0039'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_runs_status', 'runs', ['status'], unique=False, schema='onward')
    op.drop_index('ix_runs_status_lease', table_name='runs', schema='onward')
    op.execute("ALTER TABLE onward.runs SET (fillfactor = 90)")


def downgrade() -> None:
    op.execute("ALTER TABLE onward.runs RESET (fillfactor)")
    op.create_index('ix_runs_status_lease', 'runs', ['status', 'lease_expires_at'],
                    unique=False, schema='onward')
    op.drop_index('ix_runs_status', table_name='runs', schema='onward')
