"""Apply the ledger's Alembic migrations programmatically (``onward db upgrade``)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Engine

from ledger.db import wrap_driver_errors

__all__ = ["MIGRATIONS", "alembic_config", "downgrade", "upgrade"]


MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the database to ``revision`` (idempotent; safe to run from several processes)."""
    with wrap_driver_errors("migrating the ledger"):
        command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    with wrap_driver_errors("migrating the ledger"):
        command.downgrade(alembic_config(engine), revision)
