"""Alembic environment: the engine comes from ``ledger.migrate``; the version table is
``onward.onward_alembic_version``."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from ledger import sql
from ledger.db import newer_schema, newer_than_code
from ledger.migrate import MIGRATION_LOCK_KEY
from ledger.schema import SCHEMA, VERSION_TABLE, metadata


def _refuse_newer(connection: sa.Connection) -> None:
    """Under the lock, check again what ``ledger.migrate.upgrade`` checked before it: a
    newer release may have upgraded the ledger while this one waited for the lock (two
    deploys at once). Refused by name (``SchemaMismatch``), not as a revision Alembic
    cannot locate."""
    if connection.execute(sql.text("version_table")).scalar() is None:
        return
    found = connection.execute(sql.text("stored_revision")).scalar()
    if found is not None and newer_than_code(str(found)):
        raise newer_schema(str(found))


def run_migrations_online() -> None:
    engine = context.config.attributes["engine"]
    with engine.connect() as connection:
        connection.execute(sql.text("watch_client"))
        connection.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        try:
            _refuse_newer(connection)
            connection.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
            connection.commit()
            context.configure(
                connection=connection,
                target_metadata=metadata,
                version_table=VERSION_TABLE,
                version_table_schema=SCHEMA,
                include_schemas=True,
                include_name=lambda name, type_, parent: (
                    type_ != "schema" or name == SCHEMA
                ),
            )
            with context.begin_transaction():
                context.run_migrations()
        finally:
            connection.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
            connection.commit()


run_migrations_online()
