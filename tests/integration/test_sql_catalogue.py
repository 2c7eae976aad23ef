"""Every statement of the SQL catalogue (ledger/sql/*.sql) names only tables and columns
that ``ledger/schema.py`` declares: PostgreSQL's own parser and analyser prepare each one
against a database built from ``ledger.schema.metadata`` alone (not from the migrations,
whose agreement with the metadata tests/integration/test_migrations.py checks)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from harness.databases import create_database, drop_database
from ledger import sql
from ledger.db import libpq_conninfo
from ledger.schema import SCHEMA, VERSION_TABLE, metadata

_PARAM = re.compile(r"%\((\w+)\)s")
_FUNCTION = re.compile(r"\s*CREATE OR REPLACE FUNCTION onward\.(\w+)")
MIGRATIONS = Path(sql.__file__).resolve().parents[1] / "migrations" / "versions"


@pytest.fixture(scope="module")
def schema_only(server_urls: dict[str, str]) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A database holding exactly the tables of ledger/schema.py (and the version table
    and clock function the statements use), built without the migrations."""
    name, url = create_database(server_urls["database"], "onward_cat", migrate=False)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"CREATE SCHEMA {SCHEMA}"))
            conn.execute(sa.text(f"CREATE TABLE {SCHEMA}.{VERSION_TABLE} "
                                 "(version_num varchar(32) PRIMARY KEY)"))
            conn.execute(sa.text(f"CREATE FUNCTION {SCHEMA}.now() RETURNS timestamptz "
                                 "LANGUAGE sql STABLE AS $$ SELECT now() $$"))
            metadata.create_all(conn)
            for definition in migrated_functions().values():
                conn.exec_driver_sql(definition)
        with psycopg.connect(libpq_conninfo(url), autocommit=True) as raw:
            yield raw
    finally:
        engine.dispose()
        drop_database(server_urls["database"], name)


def migrated_functions() -> dict[str, str]:
    """The latest definition of each function of the onward schema the migrations create
    (statements call some, e.g. onward.limit_acquire), read from the migration modules'
    string constants; onward.now() is the clock's, created above without its offset."""
    found: dict[str, str] = {}
    for path in sorted(MIGRATIONS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                match = _FUNCTION.match(node.value)
                if match and match[1] != "now":
                    found[match[1]] = node.value
    return found


def positional(text: str) -> str:
    """The statement with ``$n`` parameters (what PREPARE takes) for its ``%(name)s``."""
    numbers: dict[str, int] = {}
    return _PARAM.sub(lambda m: f"${numbers.setdefault(m[1], len(numbers) + 1)}",
                      text).replace("%%", "%")


@pytest.mark.parametrize("name", sorted(sql.STATEMENTS))
def test_catalogue__every_statement_prepares_against_the_schema(
        schema_only: psycopg.Connection[tuple[object, ...]], name: str) -> None:
    """Parsing and analysing the statement finds every table, column and type it names,
    and infers a type for every parameter."""
    schema_only.execute(f"PREPARE catalogue_check AS {positional(sql.statement(name))}")
    schema_only.execute("DEALLOCATE catalogue_check")


def test_catalogue__a_misspelt_column_is_found(
        schema_only: psycopg.Connection[tuple[object, ...]]) -> None:
    """The check above can fail: a column ledger/schema.py lacks is refused."""
    with pytest.raises(psycopg.errors.UndefinedColumn):
        schema_only.execute("PREPARE catalogue_check AS SELECT lease_owner_x FROM onward.runs")
