"""Whole databases on a PostgreSQL server: create one (empty, migrated, or a copy of a
template), drop one, name one, and show a URL without its password.

Tests, benchmarks and the demo make a database of their own through ``harness.databases``,
which calls these: outside ``ledger/`` nothing imports SQLAlchemy or psycopg
(docs/design.md, "Where SQL lives"). ``CREATE DATABASE`` and ``DROP DATABASE`` name their
database, which a bound parameter cannot do and Core has no construct for; the name is
quoted by the dialect's identifier preparer.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ledger.migrate import upgrade

__all__ = ["create_database", "database_at", "drop_database", "migrate_database", "redact_url"]


# Templates, not f-strings: a database's name is quoted by the connection's dialect
_CREATE = "CREATE DATABASE {name}"
_COPY = "CREATE DATABASE {name} TEMPLATE {template}"
_DROP = "DROP DATABASE IF EXISTS {name} WITH (FORCE)"


def create_database(admin_url: str, name: str, *, template: str | None = None) -> str:
    """Create database ``name`` on the server of ``admin_url`` (a copy of database
    ``template`` if given, else empty); return its SQLAlchemy URL."""
    def ddl(quote: Callable[[str], str]) -> str:
        if template:
            return _COPY.format(name=quote(name), template=quote(template))
        return _CREATE.format(name=quote(name))

    _autocommit(admin_url, ddl)
    return database_at(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop ``name`` if it exists, ending every session on it (PostgreSQL 13 and later)."""
    _autocommit(admin_url, lambda quote: _DROP.format(name=quote(name)))


def migrate_database(url: str) -> None:
    """Bring the database at ``url`` to the onward schema, with an engine of its own."""
    engine = sa.create_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()


def database_at(url: str, name: str) -> str:
    """The URL of database ``name`` on the server (and as the user) of ``url``."""
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def redact_url(url: str) -> str:
    """A database or broker URL with its password hidden, for logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # a redis URL: hide a password if any
        head, sep, tail = url.rpartition("@")
        return f"{head.split('//')[0]}//***@{tail}" if sep else url


def _autocommit(admin_url: str, ddl: Callable[[Callable[[str], str]], str]) -> None:
    """Run the statement ``ddl`` writes, given the dialect's identifier quoting, outside a
    transaction (CREATE and DROP DATABASE refuse to run in one)."""
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            quote = conn.dialect.identifier_preparer.quote_identifier
            conn.execute(sa.text(ddl(quote)))
    finally:
        engine.dispose()
