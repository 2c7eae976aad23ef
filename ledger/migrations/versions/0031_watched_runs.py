"""watched runs: a run NOTIFYs its progress only while someone watches it

Revision ID: 0031
Revises: 0030

``runs.watchers`` counts the ``Ledger.wait``/``events`` (and asyncio client) watchers of a run;
the ``runs_notify_progress`` trigger (migration 0021) fires only while it is above zero. A
NOTIFY takes a cluster-wide lock from the statement's commit until its WAL is flushed, so
every step commit serialized with every other notifying commit of the server (no group
commit), whether anyone listened or not. A watcher registers with an UPDATE of the run row
after its LISTEN and before its first read: that UPDATE waits for a commit holding the row,
so the read sees that commit, and any later commit reads the count and notifies
(ledger/watch.py).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0031'
down_revision = '0030'
branch_labels = None
depends_on = None

CHANGED = "(OLD.seq IS DISTINCT FROM NEW.seq OR OLD.status IS DISTINCT FROM NEW.status)"


def _trigger(when: str) -> None:
    op.execute("DROP TRIGGER IF EXISTS runs_notify_progress ON onward.runs")
    op.execute(f"""
CREATE TRIGGER runs_notify_progress AFTER UPDATE OF seq, status ON onward.runs
FOR EACH ROW WHEN ({when})
EXECUTE FUNCTION onward.notify_run_progress()
""")


def upgrade() -> None:
    op.add_column('runs', sa.Column('watchers', sa.Integer(), server_default=sa.text('0'),
                                    nullable=False), schema='onward')
    _trigger(f"NEW.watchers > 0 AND {CHANGED}")


def downgrade() -> None:
    _trigger(CHANGED)
    op.drop_column('runs', 'watchers', schema='onward')
