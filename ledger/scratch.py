"""The scratch ledger of an offline replay (docs/corpus.md#where-a-replay-runs): a
throwaway database on the configured PostgreSQL server (or on the embedded one when none is
configured), created, migrated, used and dropped by the command. The source ledger is never
written: a replay loads a bundle into its scratch ledger and runs there.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import sqlalchemy as sa

from ledger import sql
from ledger.admin import database_at, migrate_database
from ledger.db import database_url, normalize_url, wrap_driver_errors
from ledger.exceptions import OperationRefused
from ledger.schema import SCHEMA
from ledger.settings import OnwardSettings

__all__ = ["PREFIX", "scratch_database"]


PREFIX = "onward_replay"


@contextmanager
def scratch_database(settings: OnwardSettings, url: str | None = None) -> Iterator[str]:
    """Yield the URL of a migrated, empty ledger database that is gone afterwards.

    Without ``url``, a new database ``onward_replay_<random>`` on the server of the
    configured ledger (the embedded one when none is configured), dropped on exit. With
    ``url``, that database, which must hold no onward schema; its ``onward`` schema is
    dropped on exit."""
    if url is not None:
        with _given(normalize_url(url)) as given:
            yield given
        return
    base = database_url(settings)
    name = f"{PREFIX}_{secrets.token_hex(6)}"
    _admin(base, f'CREATE DATABASE "{name}"', what="create a scratch database")
    try:
        # a throwaway database need not wait for its commits to reach the disk
        _admin(base, f'ALTER DATABASE "{name}" SET synchronous_commit = off',
               what="configure the scratch database")
        scratch = database_at(base, name)
        migrate_database(scratch)
        yield scratch
    finally:
        _admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
               what="drop the scratch database")


@contextmanager
def _given(url: str) -> Iterator[str]:
    """Use a database the operator named: refused (and left untouched) when it already holds
    an onward schema, which may be a real ledger; otherwise the schema this replay creates
    is the only thing it drops afterwards."""
    engine = sa.create_engine(url)
    try:
        with wrap_driver_errors("checking the scratch database"), engine.connect() as conn:
            found = conn.execute(sql.text("onward_schema")).scalar()
        if found is not None:
            raise OperationRefused(
                "the scratch database already holds an onward schema (a ledger?): a replay "
                "creates, uses, then drops the onward schema of the database it is given, so "
                "it needs one without; nothing was changed")
        try:
            migrate_database(url)
            yield url
        finally:
            with wrap_driver_errors("emptying the scratch database"), engine.begin() as conn:
                conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
    finally:
        engine.dispose()


def _admin(url: str, statement: str, *, what: str) -> None:
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with wrap_driver_errors(what), engine.connect() as conn:
            conn.execute(sa.text(statement))
    except sa.exc.ProgrammingError as exc:
        if isinstance(exc.orig, psycopg.errors.InsufficientPrivilege):
            raise OperationRefused(
                f"cannot {what}: the database user may not create databases. Grant it "
                "CREATEDB, or give the replay an empty database of its own with "
                "--scratch-url") from exc
        raise
    finally:
        engine.dispose()
