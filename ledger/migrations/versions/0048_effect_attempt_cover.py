"""how long a provider call was covered for: effect_attempts.covered_until

Revision ID: 0048
Revises: 0047

A worker extends its lease over a call's time limit and the lease margin before the call
starts (``begin_effect_attempt``); the lease then moves on (a heartbeat, a park, the
reaper clear it), so nothing kept how long that one call was covered for. ``onward effects
resolve --not-sent`` needs it: a call never seen to end may still land at the provider
until some time after its cover ran out, and a person who says "not sent" before then may
be looking before it lands (docs/operating.md, "Resolve an effect by hand").
``covered_until`` is the call's start plus its cover, written as the attempt begins.
Attempts begun before this revision, and an operator's repeat (which holds no lease), have
none: they are counted from their start with ``ONWARD_TOOL_TIMEOUT_S``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0048'
down_revision = '0047'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('effect_attempts',
                  sa.Column('covered_until', sa.DateTime(timezone=True), nullable=True),
                  schema='onward')


def downgrade() -> None:
    """Drops each attempt's cover: a resolve then counts every call from its start."""
    op.drop_column('effect_attempts', 'covered_until', schema='onward')
