"""Engines, connections and the schema-revision check. Driver errors are wrapped here."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy import event

# Engine is re-exported: code outside ledger/ holds engines without importing SQLAlchemy
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.engine import Engine as Engine

from ledger import sql
from ledger.exceptions import InvalidInput, LedgerUnavailable, SchemaMismatch, StatementRefused
from ledger.settings import OnwardSettings

__all__ = [
    "HEAD_REVISION",
    "SET_TENANT",
    "TENANT_OPTION",
    "Engine",
    "RevisionWatch",
    "connect_raw",
    "create_engine",
    "current_revision",
    "database_url",
    "engine_of_its_own",
    "libpq_conninfo",
    "newer_schema",
    "newer_than_code",
    "normalize_url",
    "require_current_schema",
    "require_revision_txn",
    "revision_changed",
    "scoped_to_tenant",
    "set_tenant",
    "snapshot",
    "stored_revision",
    "wrap_driver_errors",
    "write_refused",
]


HEAD_REVISION = "0048"
"""The Alembic revision this code expects; bump with every migration."""


def database_url(settings: OnwardSettings) -> str:
    """The SQLAlchemy URL of the ledger database; starts the embedded server when unset."""
    if settings.database_url:
        return normalize_url(settings.database_url)
    from ledger.embedded import postgres_url

    return postgres_url(settings.home_dir)


def normalize_url(url: str) -> str:
    """Accept ``postgres://``, ``postgresql://`` or ``postgresql+psycopg://``; use psycopg 3."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1))
    if parsed.drivername in ("postgresql", "postgresql+psycopg2", "postgresql+psycopg"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def libpq_conninfo(sqlalchemy_url: str) -> str:
    """The same URL in the form psycopg.connect() takes (for the hot path and LISTEN)."""
    parsed = make_url(sqlalchemy_url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


@lru_cache(maxsize=8)
def _engine_for(url: str, pool_size: int) -> Engine:
    return sa.create_engine(url, pool_size=pool_size, max_overflow=4, pool_pre_ping=True)


def create_engine(settings: OnwardSettings, *, pool_size: int = 5) -> Engine:
    """A pooled engine for the ledger database (one per URL per process)."""
    return _engine_for(database_url(settings), pool_size)


def engine_of_its_own(url: str, *, pool_size: int = 5) -> Engine:
    """An engine on ``url`` not shared with anyone in the process (its user disposes it)."""
    return sa.create_engine(normalize_url(url), pool_size=pool_size)


TENANT_OPTION = "onward_tenant"
"""The execution option naming the tenant every transaction of an engine acts for."""

SET_TENANT = sql.statement("set_tenant")
"""Row-level security keys every table of tenant data on ``onward.tenant`` (migration 0027);
a transaction that sets none sees no rows (docs/security.md)."""


def scoped_to_tenant(engine: Engine, tenant_id: str) -> Engine:
    """The same engine (and pool), each of its transactions first setting ``onward.tenant``
    to ``tenant_id`` for that transaction only (the pool's connections serve every tenant)."""
    return engine.execution_options(**{TENANT_OPTION: tenant_id})


def set_tenant(conn: psycopg.Connection[Any], tenant_id: str, *, local: bool = True) -> None:
    """Set the tenant on a plain psycopg connection: for its transaction (``local``), or for
    the session of a connection that serves one tenant only (a LISTEN connection)."""
    conn.execute(SET_TENANT, {"tenant": tenant_id, "local": local})


@event.listens_for(Engine, "begin")
def _begin_as_tenant(conn: Connection) -> None:
    tenant = conn.get_execution_options().get(TENANT_OPTION)
    if tenant is None:
        return
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(SET_TENANT, {"tenant": tenant, "local": True})
    finally:
        cursor.close()


@contextmanager
def snapshot(engine: Engine, *, read_only: bool = True) -> Iterator[Connection]:
    """One REPEATABLE READ transaction on a connection of ``engine`` (read-only unless
    ``read_only`` is false): every statement in it reads the same snapshot."""
    with engine.connect() as conn:  # returned to the pool even if what follows fails
        conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            if read_only:
                conn.execute(sa.text("SET TRANSACTION READ ONLY"))
            yield conn


def connect_raw(url: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    """A plain psycopg connection, for the step hot path and LISTEN/NOTIFY."""
    try:
        return psycopg.connect(libpq_conninfo(url), autocommit=autocommit)
    except psycopg.Error as exc:
        raise LedgerUnavailable(f"cannot connect to the ledger database: {exc}") from exc


@contextmanager
def wrap_driver_errors(action: str) -> Iterator[None]:
    """Turn psycopg/SQLAlchemy errors into onward errors, once, at the ledger edge: a lost
    database is LedgerUnavailable, a value it cannot store InvalidInput, any other refused
    statement StatementRefused (none of them wrote anything)."""
    try:
        yield
    except sa.exc.ProgrammingError as exc:
        if isinstance(exc.orig, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
            raise SchemaMismatch(f"{action}: the ledger database has no onward schema (or an "
                                 "old one): run `onward db upgrade` first") from exc
        raise StatementRefused(f"{action}: the ledger database refused the statement: "
                               f"{_cause(exc)}") from exc
    except (psycopg.OperationalError, sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
        raise LedgerUnavailable(f"{action}: the ledger database failed: {exc}") from exc
    except (sa.exc.DataError, psycopg.DataError) as exc:
        raise InvalidInput(f"{action}: the ledger database cannot store a value given: "
                           f"{_cause(exc)}") from exc
    except (sa.exc.DBAPIError, psycopg.Error) as exc:
        raise StatementRefused(f"{action}: the ledger database refused the statement: "
                               f"{_cause(exc)}") from exc


def _cause(exc: Exception) -> str:
    """The database's own message, without the statement SQLAlchemy appends."""
    orig = getattr(exc, "orig", None) or exc
    return str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__


def current_revision(engine: Engine) -> str | None:
    """The Alembic revision stored in the database, or None when never migrated."""
    with wrap_driver_errors("reading the schema revision"), engine.connect() as conn:
        if conn.execute(sql.text("version_table")).scalar() is None:
            return None
        value = conn.execute(sql.text("stored_revision")).scalar()
        return str(value) if value is not None else None


def require_current_schema(engine: Engine) -> None:
    """Refuse to start a worker, dispatcher or reaper on a database at another revision."""
    found = current_revision(engine)
    if found is not None and newer_than_code(found):
        raise newer_schema(found)
    if found != HEAD_REVISION:
        state = "has no onward schema" if found is None else f"is at revision {found}"
        raise SchemaMismatch(
            f"the ledger database {state}, this code needs {HEAD_REVISION}: "
            "run `onward db upgrade` first"
        )


def newer_than_code(found: str) -> bool:
    """Whether the stored revision ``found`` is later than this code's (revisions are
    zero-padded numbers: they compare as text)."""
    return found > HEAD_REVISION


def newer_schema(found: str) -> SchemaMismatch:
    """The error for a ledger a newer onward release upgraded: this code must not run on
    it, and `onward db upgrade` cannot help (it never downgrades)."""
    return SchemaMismatch(
        f"the ledger database is at revision {found}, newer than this code's "
        f"{HEAD_REVISION} (a newer onward release upgraded it): run the onward release "
        "that upgraded it; onward never downgrades the ledger (to go back, restore a "
        "backup taken before the upgrade)")


def stored_revision(url: str) -> str | None:
    """The stored revision, read on a connection of its own that is closed at once (safe in
    a process that forks pool children; one connection per check)."""
    conn = connect_raw(url)
    try:
        with wrap_driver_errors("reading the schema revision"):
            table = conn.execute(sql.statement("version_table")).fetchone()
            if table is None or table[0] is None:
                return None
            row = conn.execute(sql.statement("stored_revision")).fetchone()
            return str(row[0]) if row is not None and row[0] is not None else None
    finally:
        conn.close()


def revision_changed(found: str | None) -> SchemaMismatch:
    """The error of a process that notices, while it runs, that the ledger is no longer at
    the revision of its code (``onward db upgrade`` ran meanwhile)."""
    state = "has no onward schema" if found is None else f"is at revision {found}"
    return SchemaMismatch(
        f"the ledger database now {state}, and this code needs {HEAD_REVISION} (`onward db "
        "upgrade` ran while this process was running): it stops taking work; restart it "
        "with the code for the database's revision")


def require_revision_txn(conn: Connection) -> None:
    """Refuse, in the caller's transaction and before it writes, to go on when the ledger is
    not at this code's revision: the first statement of each operator command and of
    ``Ledger.start_run``. A console, an API server or an application that started before
    ``onward db upgrade`` ran under it then writes nothing the new code would misread (a
    signal or a decision signed as the old code signs them) until it is restarted on the
    new code. One read of a one-row table per command, none per step (the claim statement
    checks the revision itself)."""
    found = conn.execute(sql.text("stored_revision")).scalar()
    if found != HEAD_REVISION:
        raise write_refused(found)


def write_refused(found: str | None) -> SchemaMismatch:
    """The error of a write refused, before anything was written, because the ledger is at
    revision ``found`` rather than this code's (``require_revision_txn``, and the start
    statement, which checks the revision itself)."""
    state = "has no onward schema" if found is None else f"is at revision {found}"
    return SchemaMismatch(
        f"the ledger database now {state}, and this code needs {HEAD_REVISION} (`onward "
        "db upgrade` ran while this process was running): nothing was written; restart "
        "this process with the code for the database's revision")


class RevisionWatch:
    """Notices a schema upgrade while a long-running process (worker, dispatcher, reaper)
    runs: ``check()`` reads the stored revision at most once every ``every_s`` seconds and
    raises ``SchemaMismatch`` once it is not this code's. A database that cannot be reached
    is left to the caller's own handling (the check is tried again at the next call)."""

    def __init__(self, url: str, every_s: float) -> None:
        self._url = url
        self.every_s = every_s
        self._next = time.monotonic() + every_s

    def check(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        try:
            found = stored_revision(self._url)
        except LedgerUnavailable:
            return
        if found != HEAD_REVISION:
            raise revision_changed(found)
