"""a signal is signed when it is sent: signals.mac

Revision ID: 0035
Revises: 0034

``key_id:HMAC`` of the signal's run, name and payload (ledger/signed.py ``signal``), written
by the send; the step that reads it (``ctx.signal``), an evidence replay reading its
source's and ``onward verify`` check it (an edit of a consumed signal's payload changed what
a step saw, unnoticed). Signals that exist when this migration runs are signed here, as they
stand, with the checkpoint key every onward process uses (run it with the same
``ONWARD_CHECKPOINT_KEY``; `onward verify --all` first).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0035'
down_revision = '0034'
branch_labels = None
depends_on = None

EXISTING = sa.text("SELECT id, run_id, name, payload FROM onward.signals ORDER BY id")


def _signed(row: Any) -> dict[str, Any]:
    """The body this revision signed (0037 adds the row id; ledger/signed.py ``signal``)."""
    return {"mac": "signal", "run_id": str(row["run_id"]), "name": row["name"],
            "payload": row["payload"]}


def upgrade() -> None:
    op.add_column('signals', sa.Column('mac', sa.Text(), nullable=True), schema='onward')
    from ledger.migrate import sign_existing

    sign_existing(op.get_bind(), EXISTING, "signals", "mac",
                  lambda keys, row: keys.sign(_signed(row)))


def downgrade() -> None:
    op.drop_column('signals', 'mac', schema='onward')
