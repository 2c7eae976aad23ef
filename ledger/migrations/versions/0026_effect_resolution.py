"""effect resolution: effect_attempts.kind 'resolve' (a person's finding at the provider,
recorded by `onward effects resolve`), effects.polling_since (where the status-polling
window of an accepted effect starts once a person continued a stalled run)

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0026'
down_revision = '0025'
branch_labels = None
depends_on = None

KIND_OLD = "kind IN ('call', 'lookup', 'status', 'repeat')"
KIND_NEW = "kind IN ('call', 'lookup', 'status', 'repeat', 'resolve')"


def _replace_check(table: str, name: str, condition: str) -> None:
    op.drop_constraint(op.f(f'ck_{table}_{name}'), table, type_='check', schema='onward')
    op.create_check_constraint(op.f(f'ck_{table}_{name}'), table, condition, schema='onward')


def upgrade() -> None:
    _replace_check('effect_attempts', 'kind', KIND_NEW)
    op.add_column('effects', sa.Column('polling_since', sa.DateTime(timezone=True),
                                       nullable=True), schema='onward')


def downgrade() -> None:
    op.drop_column('effects', 'polling_since', schema='onward')
    op.execute("DELETE FROM onward.effect_attempts WHERE kind = 'resolve'")
    _replace_check('effect_attempts', 'kind', KIND_OLD)
