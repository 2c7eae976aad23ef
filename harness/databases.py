"""A database of one's own on a PostgreSQL server somebody else may use: created (and
migrated to the onward schema) under a random name, dropped afterwards."""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ledger.migrate import upgrade


def create_database(admin_url: str, prefix: str, *, migrate: bool = True,
                    template: str | None = None) -> tuple[str, str]:
    """Create ``<prefix>_<random>`` on the server of ``admin_url`` (a copy of the database
    ``template`` if given, else migrated to the onward schema unless ``migrate`` is false);
    return (name, SQLAlchemy URL)."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    copy = f' TEMPLATE "{template}"' if template else ""
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"{copy}'))
    finally:
        admin.dispose()
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    if migrate and not template:
        engine = sa.create_engine(url)
        try:
            upgrade(engine)
        finally:
            engine.dispose()
    return name, url


def drop_database(admin_url: str, name: str) -> None:
    """Drop ``name``, ending every session on it (PostgreSQL 13 and later)."""
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def redact(url: str) -> str:
    """A database or broker URL with its password hidden, for logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # a redis URL: hide a password if any
        head, sep, tail = url.rpartition("@")
        return f"{head.split('//')[0]}//***@{tail}" if sep else url
