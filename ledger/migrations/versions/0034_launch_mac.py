"""how a run was launched is signed: runs.launch_mac

Revision ID: 0034
Revises: 0033

``key_id:HMAC`` of the run's tenant, launch mode (ordinary, evidence, simulation, live,
branch), the run and checkpoint it was copied from and whether it may send irreversible
effects (ledger/signed.py ``launch``), written when the run is created; every claim and
``onward verify`` check it (review F10: editing runs.mode or runs.allow_irreversible
changed what a replay may do to the outside world, unnoticed). Runs that exist when this
migration runs are signed here, as they stand, with the checkpoint key every onward
process uses (run it with the same ``ONWARD_CHECKPOINT_KEY``; `onward verify --all` first).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0034'
down_revision = '0033'
branch_labels = None
depends_on = None

EXISTING = sa.text("SELECT id, tenant_id, mode, parent_run_id, parent_seq, allow_irreversible "
                   "FROM onward.runs ORDER BY id")


def upgrade() -> None:
    op.add_column('runs', sa.Column('launch_mac', sa.Text(), nullable=True), schema='onward')
    from ledger import signed
    from ledger.migrate import sign_existing

    sign_existing(op.get_bind(), EXISTING, "runs", "launch_mac",
                  lambda keys, row: keys.sign(signed.launch(row["id"], row)))


def downgrade() -> None:
    op.drop_column('runs', 'launch_mac', schema='onward')
