"""an effect's recipient is signed: effects.recipient_mac

Revision ID: 0047
Revises: 0046

``effects.recipient`` (where an effect went, as shown: the text a tool derives from the
payload, or ``***`` beside a sealed payload) was covered by no MAC: an edit in the database
passed ``onward verify`` while ``effects show``, ``runs show`` and the plans of ``effects
repeat`` and ``effects resolve`` showed it. ``recipient_mac`` is ``key_id:HMAC`` of
ledger/signed.py ``effect_recipient`` (effect type and id, the recipient), written with the
intent; ``onward verify`` checks each recipient that is there (retention and a bundle's
``--drop-field effects.recipient`` drop the text, leaving nothing to check). Recipients
that exist when this migration runs are signed here, as they stand, with the checkpoint key
every onward process uses (run it with the same ``ONWARD_CHECKPOINT_KEY``): nothing signed
them before, so an edit made before this revision is not detected, and none is laundered.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0047'
down_revision = '0046'
branch_labels = None
depends_on = None

EXISTING = sa.text("SELECT effect_type, effect_id, recipient FROM onward.effects "
                   "WHERE recipient IS NOT NULL ORDER BY effect_type, effect_id")
SIGN = sa.text("UPDATE onward.effects SET recipient_mac = :signed_mac "
               "WHERE effect_type = :effect_type AND effect_id = :effect_id")


def _signed(row: Any) -> dict[str, Any]:
    """The body this revision signs (ledger/signed.py ``effect_recipient``, kept here as it
    stands so that a later change there does not change what this migration did)."""
    return {"mac": "effect_recipient", "effect_type": row["effect_type"],
            "effect_id": row["effect_id"], "recipient": row["recipient"]}


def upgrade() -> None:
    op.add_column('effects', sa.Column('recipient_mac', sa.Text(), nullable=True),
                  schema='onward')
    conn = op.get_bind()
    result = conn.execute(EXISTING).mappings()
    keys = None
    while found := result.fetchmany(5000):
        if keys is None:
            from ledger.migrate import migration_keys

            keys = migration_keys(conn)
        conn.execute(SIGN, [{"signed_mac": keys.sign(_signed(row)),
                             "effect_type": row["effect_type"], "effect_id": row["effect_id"]}
                            for row in found])


def downgrade() -> None:
    op.drop_column('effects', 'recipient_mac', schema='onward')
