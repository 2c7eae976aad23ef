"""The database's clock in the ledger's queries (docs/design.md section 13, invariant 7).

Every time the ledger compares is ``onward.now()`` (migration 0007), never a host's wall
clock: a filter given as a span ("the last 2 hours") is resolved against it in SQL.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

__all__ = ["TimeOrSpan", "at_or_ago"]


TimeOrSpan = datetime | timedelta
"""An instant (aware), or a span back from the database's now."""


def at_or_ago(when: TimeOrSpan) -> Any:
    """``when`` itself, or ``onward.now() - when`` for a span, as a SQL expression."""
    if isinstance(when, timedelta):
        return sa.func.onward.now() - when
    return when
