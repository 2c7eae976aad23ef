"""A database of one's own on a PostgreSQL server somebody else may use: created (and
migrated to the onward schema) under a random name, dropped afterwards. The statements are
the ledger's (ledger/admin.py): nothing outside ``ledger/`` imports SQLAlchemy or psycopg."""

from __future__ import annotations

import secrets

from ledger.admin import create_database as _create
from ledger.admin import drop_database, migrate_database
from ledger.admin import redact_url as redact

__all__ = ["create_database", "drop_database", "redact"]


def create_database(admin_url: str, prefix: str, *, migrate: bool = True,
                    template: str | None = None) -> tuple[str, str]:
    """Create ``<prefix>_<random>`` on the server of ``admin_url`` (a copy of the database
    ``template`` if given, else migrated to the onward schema unless ``migrate`` is false);
    return (name, SQLAlchemy URL)."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    url = _create(admin_url, name, template=template)
    if migrate and not template:
        migrate_database(url)
    return name, url
