"""Alembic environment: the engine comes from ``ledger.migrate``; the version table is
``onward.onward_alembic_version``."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from ledger.schema import SCHEMA, VERSION_TABLE, metadata

# Several processes may upgrade at once (compose starts them together): serialize them.
MIGRATION_LOCK_KEY = 0x0_0A_1E_D6_E1


def run_migrations_online() -> None:
    engine = context.config.attributes["engine"]
    with engine.connect() as connection:
        connection.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        connection.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        connection.commit()
        try:
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
