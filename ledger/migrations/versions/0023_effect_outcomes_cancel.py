"""effect outcomes and cooperative cancel: effects.status 'unsent', runs.cancel_requested,
step_attempts.outcome 'cancelled'

Revision ID: 0023
Revises: 0022

An effect that never reached the provider (no call, a stated refusal, or a lookup that found
nothing) is closed ``unsent`` when its run ends, instead of ``failed``. A cancel of a run a
worker holds is recorded in ``runs.cancel_requested`` and honoured by that worker.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None

EFFECT_STATUS_OLD = "status IN ('pending', 'accepted', 'completed', 'failed')"
EFFECT_STATUS_NEW = "status IN ('pending', 'accepted', 'completed', 'failed', 'unsent')"
ATTEMPT_OLD = ("outcome IS NULL OR outcome IN ('committed', 'failed', 'lease_lost', "
               "'released', 'parked', 'worker_lost', 'waiting')")
ATTEMPT_NEW = ("outcome IS NULL OR outcome IN ('committed', 'failed', 'lease_lost', "
               "'released', 'parked', 'worker_lost', 'waiting', 'cancelled')")


def _replace_check(table: str, name: str, condition: str) -> None:
    op.drop_constraint(op.f(f'ck_{table}_{name}'), table, type_='check', schema='onward')
    op.create_check_constraint(op.f(f'ck_{table}_{name}'), table, condition, schema='onward')


def upgrade() -> None:
    _replace_check('effects', 'status', EFFECT_STATUS_NEW)
    _replace_check('step_attempts', 'outcome', ATTEMPT_NEW)
    op.add_column('runs', sa.Column('cancel_requested', postgresql.JSONB(astext_type=sa.Text()),
                                    nullable=True), schema='onward')


def downgrade() -> None:
    op.drop_column('runs', 'cancel_requested', schema='onward')
    op.execute("UPDATE onward.step_attempts SET outcome = 'failed' WHERE outcome = 'cancelled'")
    _replace_check('step_attempts', 'outcome', ATTEMPT_OLD)
    op.execute("UPDATE onward.effects SET status = 'failed' WHERE status = 'unsent'")
    _replace_check('effects', 'status', EFFECT_STATUS_OLD)
