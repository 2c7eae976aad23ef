"""Apply the ledger's Alembic migrations programmatically (``onward db upgrade``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection, Engine, RowMapping

from ledger import sql
from ledger.checkpoints import CheckpointKeys
from ledger.db import current_revision, newer_schema, newer_than_code, wrap_driver_errors
from ledger.exceptions import IntegrityViolation, InvalidInput
from ledger.settings import OnwardSettings

__all__ = ["MIGRATIONS", "MIGRATION_LOCK_KEY", "alembic_config", "downgrade", "migration_keys",
           "sign_existing", "upgrade"]


MIGRATIONS = Path(__file__).parent / "migrations"
MIGRATION_LOCK_KEY = 0x0_0A_1E_D6_E1
"""The advisory lock every migration holds (ledger/migrations/env.py): several processes may
upgrade at once (compose starts them together, two deploy jobs), one at a time."""


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the database to ``revision`` (idempotent; safe to run from several processes).
    A database a newer release upgraded is refused (``SchemaMismatch``), untouched."""
    found = current_revision(engine)
    if found is not None and newer_than_code(found):
        raise newer_schema(found)
    with wrap_driver_errors("migrating the ledger"):
        command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Take the database back to ``revision``: for tests and development only (onward never
    downgrades a ledger; no command calls this). A downgrade drops what later revisions
    added, with no warning: standing refusals (0039: a retried step then calls the model
    again), sealed requests (0046), recipient MACs (0047), and each column or table a
    revision's ``downgrade`` drops. To go back in production, restore a backup."""
    with wrap_driver_errors("migrating the ledger"):
        command.downgrade(alembic_config(engine), revision)


LATEST_HEADS = sql.text("latest_signed_heads")


def migration_keys(conn: Connection) -> CheckpointKeys:
    """The checkpoint keys a migration that signs (or re-signs) existing rows uses: the
    configured ones (``ONWARD_CHECKPOINT_KEY``, ``ONWARD_CHECKPOINT_OLD_KEYS``), checked
    first against the ledger. When runs have signed heads (0013) and none of the 20 latest
    verifies under them, the key is not the one the ledger was signed with (a deploy job
    without ``ONWARD_CHECKPOINT_KEY`` makes a development key of its own): signing with it
    would leave every row it signs failing verification, and a re-signing migration would
    re-sign nothing. Refused (``InvalidInput``), the upgrade rolled back."""
    keys = CheckpointKeys.from_settings(OnwardSettings())
    heads = conn.execute(LATEST_HEADS).mappings().all()
    for head in heads:
        body = {"mac": "head", "run_id": str(head["id"]), "seq": head["seq"],
                "head_hash": head["head_hash"]}  # ledger/signed.py head, as of 0013
        try:
            keys.check(body, head["head_mac"], "a run's head")
        except IntegrityViolation:
            continue
        return keys
    if heads:
        raise InvalidInput(
            "this migration signs existing rows with the checkpoint key, and no recent run "
            "head of this ledger verifies under the configured key: set "
            "ONWARD_CHECKPOINT_KEY (and ONWARD_CHECKPOINT_OLD_KEYS) to the key every onward "
            "process of this ledger uses, then run `onward db upgrade` again; nothing was "
            "changed")
    return keys


def sign_existing(conn: Connection, rows: sa.TextClause, table: str, column: str,
                  mac: Callable[[CheckpointKeys, RowMapping], str], *, batch: int = 5000) -> None:
    """For a migration that adds a MAC column: write ``mac(keys, row)`` into ``column`` of
    each row of ``table`` that ``rows`` selects (with its ``id``), ``batch`` rows per
    statement, as they stand, with the checkpoint key every onward process uses (read only
    when there is a row to sign)."""
    target = sa.table(table, sa.column("id"), sa.column(column), schema="onward")
    update = (sa.update(target).where(target.c.id == sa.bindparam("row_id"))
              .values({column: sa.bindparam("signed_mac")}))
    result = conn.execute(rows).mappings()
    keys = None
    while found := result.fetchmany(batch):
        keys = keys or migration_keys(conn)
        conn.execute(update, [{"row_id": row["id"], "signed_mac": mac(keys, row)}
                              for row in found])
