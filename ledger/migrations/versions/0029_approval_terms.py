"""an approval's terms are signed: approvals.terms_mac

Revision ID: 0029
Revises: 0028

``key_id:HMAC`` of what an approval asks and of whom (ledger/signed.py ``approval_terms``:
run, tenant, seq, step, action, artifact hash, approvers, created and expiry times), written
with the approval; approve and reject, the step the approval resumes and ``onward verify``
check it (review F19). Approvals that exist when this migration runs are signed here, as
they stand, with the checkpoint key every onward process uses (run it with the same
``ONWARD_CHECKPOINT_KEY``; run ``onward verify --all`` before upgrading).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision = '0029'
down_revision = '0028'
branch_labels = None
depends_on = None

EXISTING = sa.text("SELECT * FROM onward.approvals")


def upgrade() -> None:
    op.add_column('approvals', sa.Column('terms_mac', sa.Text(), nullable=True),
                  schema='onward')
    conn = op.get_bind()
    existing = conn.execute(EXISTING).mappings().all()
    if existing:
        _sign_existing(conn, existing)


def _sign_existing(conn: sa.Connection, existing: Sequence[sa.RowMapping]) -> None:
    from ledger import signed
    from ledger.checkpoints import CheckpointKeys
    from ledger.settings import OnwardSettings

    keys = CheckpointKeys.from_settings(OnwardSettings())
    conn.execute(sa.text("UPDATE onward.approvals SET terms_mac = :mac WHERE id = :id"),
                 [{"mac": keys.sign(signed.approval_terms(row)), "id": row["id"]}
                  for row in existing])


def downgrade() -> None:
    op.drop_column('approvals', 'terms_mac', schema='onward')
