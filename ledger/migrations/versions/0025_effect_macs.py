"""effects and their attempts are signed: effects.intent_mac, effects.outcome_mac,
effect_attempts.mac

Revision ID: 0025
Revises: 0024

``intent_mac`` signs what was requested (written with the intent), ``outcome_mac`` what it
came to once completed or failed, ``effect_attempts.mac`` each attempt as it ended
(ledger/signed.py). Rows that exist when this migration runs are signed here with the
checkpoint key every onward process uses (run it with the same ``ONWARD_CHECKPOINT_KEY``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('effects', sa.Column('intent_mac', sa.Text(), nullable=True), schema='onward')
    op.add_column('effects', sa.Column('outcome_mac', sa.Text(), nullable=True),
                  schema='onward')
    op.add_column('effect_attempts', sa.Column('mac', sa.Text(), nullable=True),
                  schema='onward')
    conn = op.get_bind()
    if conn.execute(sa.text("SELECT EXISTS (SELECT 1 FROM onward.effects)")).scalar():
        _sign_existing(conn)


def _sign_existing(conn: sa.Connection) -> None:
    from ledger import signed
    from ledger.checkpoints import CheckpointKeys
    from ledger.settings import OnwardSettings

    keys = CheckpointKeys.from_settings(OnwardSettings())
    for row in conn.execute(sa.text("SELECT * FROM onward.effects")).mappings().all():
        outcome = None
        if row["status"] in ("completed", "failed"):
            outcome = keys.sign(signed.effect_outcome(
                row["effect_type"], row["effect_id"], row["status"], row["provider_ref"],
                row["result"]))
        conn.execute(sa.text("UPDATE onward.effects SET intent_mac = :intent, "
                             "outcome_mac = :outcome WHERE effect_type = :t AND effect_id = :i"),
                     {"intent": keys.sign(signed.effect_intent(row)), "outcome": outcome,
                      "t": row["effect_type"], "i": row["effect_id"]})
    ended = conn.execute(sa.text("SELECT * FROM onward.effect_attempts "
                                 "WHERE outcome IS NOT NULL OR ended_at IS NOT NULL")
                         ).mappings().all()
    signatures = [{"mac": keys.sign(signed.effect_attempt(
        a["effect_type"], a["effect_id"], a["attempt"], a["kind"], a["idempotency_key"],
        a["outcome"], a["provider_ref"])),
        "t": a["effect_type"], "i": a["effect_id"], "n": a["attempt"]} for a in ended]
    if signatures:
        conn.execute(sa.text("UPDATE onward.effect_attempts SET mac = :mac "
                             "WHERE effect_type = :t AND effect_id = :i AND attempt = :n"),
                     signatures)


def downgrade() -> None:
    op.drop_column('effect_attempts', 'mac', schema='onward')
    op.drop_column('effects', 'outcome_mac', schema='onward')
    op.drop_column('effects', 'intent_mac', schema='onward')
