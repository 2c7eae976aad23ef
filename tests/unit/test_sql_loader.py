"""The SQL catalogue's loader (ledger/sql/__init__.py): named statements, fragments written
once and included, and a malformed file refused at import rather than at first use."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ledger import sql
from ledger.exceptions import CatalogueError


def _catalogue(tmp_path: Path, **files: str) -> dict[str, sql.Statement]:
    for name, text in files.items():
        (tmp_path / f"{name}.sql").write_text(text)
    return sql.load(tmp_path)[0]


def test_load__statements_by_name_with_their_doc(tmp_path: Path) -> None:
    found = _catalogue(tmp_path, a="-- header\n\n-- name: one\n-- Reads one.\nSELECT 1\n\n"
                                   "-- name: two\nSELECT %(x)s, %(y)s\n")
    assert [(s.name, s.file, s.doc, s.sql) for s in found.values()] == [
        ("one", "a.sql", "Reads one.", "SELECT 1"), ("two", "a.sql", "", "SELECT %(x)s, %(y)s")]
    assert found["two"].params == {"x", "y"}


def test_load__fragments_are_included_with_their_alias(tmp_path: Path) -> None:
    found = _catalogue(
        tmp_path,
        a="-- fragment: live\n-- doc\n{alias}.status = 'running'\n\n"
          "-- fragment: both\n({live(r)} AND {live(q)})\n",
        b="-- name: s\nSELECT '{}'::jsonb FROM runs r, runs q WHERE {both}\n")
    assert found["s"].sql == ("SELECT '{}'::jsonb FROM runs r, runs q "
                              "WHERE (r.status = 'running' AND q.status = 'running')")


@pytest.mark.parametrize(("text", "problem"), [
    ("-- name: s\nSELECT 1\n-- name: s\nSELECT 2\n", "defined twice"),
    ("-- name: s\nSELECT {nothing}\n", "unknown fragment"),
    ("-- fragment: f\n{alias}.id\n-- name: s\nSELECT {f}\n", "needs"),
    ("-- fragment: f\nid\n-- name: s\nSELECT {f(r)}\n", "takes no"),
    ("-- fragment: f\n{f}\n-- name: s\nSELECT {f}\n", "loop"),
    ("-- name: s\nSELECT 1 -- 100% sure\n", "neither"),
])
def test_load__a_malformed_file_is_refused(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(CatalogueError, match=problem):
        _catalogue(tmp_path, a=text)


def test_statement__an_unknown_name_is_refused() -> None:
    with pytest.raises(CatalogueError, match="no statement named 'nope'"):
        sql.statement("nope")


def test_text__placeholders_for_sqlalchemy() -> None:
    """``text()`` gives SQLAlchemy's ``:name`` binds; casts and a literal ``%`` survive."""
    clause = sql.text("lease_lost")
    assert set(clause._bindparams) == {"run_id", "epoch"}
    assert "%(" not in str(clause)


def test_catalogue__every_statement_is_used_and_every_use_exists() -> None:
    """Each named statement is taken by some ledger module (no dead SQL), and each name a
    module takes is in the catalogue (also checked at import, where it would fail first)."""
    root = Path(sql.__file__).resolve().parents[1]
    used = {m[1] for path in root.rglob("*.py")
            for m in re.finditer(r'sql\.(?:statement|text)\("(\w+)"\)', path.read_text())}
    assert sorted(set(sql.STATEMENTS) - used) == []
    assert sorted(used - set(sql.STATEMENTS)) == []


_STATEMENT = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\s")
NOT_YET_IN_CATALOGUE = {
    # `onward keys rotate` (issue 15, landed beside this check): its re-encryption composes
    # statements over tables named at run time; they are to become Core, the rest named.
    "rotation.py",
    # Time partitions (issue 15 item 5, landed beside this check): the same, per partition.
    "partitions.py",
}


def _sql_literals(source: str) -> list[int]:
    """Lines of the string literals in ``source`` that are a SQL statement."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and _STATEMENT.match(node.value)]


def test_catalogue__no_statement_is_written_outside_it() -> None:
    """No ledger module (migrations aside) holds a statement as a string: each is in
    ledger/sql/*.sql, where tests/integration/test_sql_catalogue.py checks it against the
    schema (retention's candidates query was the last one outside it)."""
    root = Path(sql.__file__).resolve().parents[1]
    found = {str(path.relative_to(root)): lines for path in sorted(root.rglob("*.py"))
             if "migrations" not in path.parts and path.name not in NOT_YET_IN_CATALOGUE
             and (lines := _sql_literals(path.read_text()))}
    assert found == {}


def test_the_check__sees_a_statement_in_a_string() -> None:
    """The rule above can fail."""
    assert _sql_literals('Q = """\nSELECT 1 FROM onward.runs\n"""\nDOC = "Select one"\n') == [1]
