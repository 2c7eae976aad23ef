"""the run's head is signed: runs.head_mac

Revision ID: 0013
Revises: 0012

``head_mac`` is ``key_id:HMAC`` of the run's id, seq and head hash (ledger/signed.py
``head``), written by every statement that moves the head. Runs that exist when this
migration runs are signed here, with the checkpoint key every onward process uses (the
migration must run with the same ``ONWARD_CHECKPOINT_KEY``), but only when their head
checkpoint verifies and is the checkpoint at their seq: a head that does not is left
unsigned, and is refused by the next claim and reported by ``onward verify``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

HEADS = sa.text("""
SELECT c.* FROM onward.runs r
  JOIN onward.checkpoints c ON c.run_id = r.id AND c.seq = r.seq AND c.hash = r.head_hash
""")


def upgrade() -> None:
    op.add_column('runs', sa.Column('head_mac', sa.Text(), nullable=True), schema='onward')
    conn = op.get_bind()
    rows = conn.execute(HEADS).mappings().all()
    if rows:
        _sign_heads(conn, rows)


def _sign_heads(conn: sa.Connection, rows: Sequence[sa.RowMapping]) -> None:
    from ledger import signed
    from ledger.checkpoints import CheckpointBody, CheckpointKeys
    from ledger.exceptions import IntegrityViolation
    from ledger.settings import OnwardSettings

    keys = CheckpointKeys.from_settings(OnwardSettings())
    for row in rows:
        try:
            keys.check(CheckpointBody.from_row(row).as_dict(), f"{row['key_id']}:{row['hash']}",
                       "head")
        except IntegrityViolation:
            continue  # left unsigned: refused by the next claim, reported by verify
        conn.execute(sa.text("UPDATE onward.runs SET head_mac = :mac WHERE id = :id"),
                     {"mac": keys.sign(signed.head(row["run_id"], row["seq"], row["hash"])),
                      "id": row["run_id"]})


def downgrade() -> None:
    op.drop_column('runs', 'head_mac', schema='onward')
