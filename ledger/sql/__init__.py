"""The ledger's hand-written SQL: named statements in ``ledger/sql/*.sql``, loaded once.

One file per area (``steps.sql``, ``effects.sql``, ...). In a file, each statement starts
with a ``-- name: <name>`` line; the comment lines right after it say what the statement
does and why, and the SQL follows up to the next ``-- name:`` or ``-- fragment:`` line.
Names are unique across files. Parameters are psycopg's named placeholders ``%(name)s``
(a literal ``%`` is written ``%%``).

A piece of SQL several statements share is written once, as a ``-- fragment: <name>``
block, and included where it is needed as ``{name}``; a fragment written for a table alias
uses ``{alias}`` in its text and is included as ``{name(e)}``. Fragments may include other
fragments. An unknown name, a duplicate, or an include left unexpanded fails at import.

The step hot path runs ``statement(name)`` on its autocommit connections, prepared
server-side (ledger/hot.py); code on a SQLAlchemy ``Connection`` runs ``text(name)``, the
same statement with SQLAlchemy's ``:name`` placeholders. Everything else is SQLAlchemy Core
over the tables of ``ledger/schema.py``. docs/design.md ("Where SQL lives") says how to add
a statement; tests/integration/test_sql_catalogue.py prepares every statement against the
tables ``ledger/schema.py`` declares.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import sqlalchemy as sa

from ledger.exceptions import CatalogueError

HERE = Path(__file__).resolve().parent
_HEADER = re.compile(r"^--\s*(name|fragment):\s*(\w+)\s*$")
_INCLUDE = re.compile(r"\{(\w+)(?:\(([\w.]+)\))?\}")
_PARAM = re.compile(r"%\((\w+)\)s")
_STRAY_PERCENT = re.compile(r"(?<!%)%(?!%)")
# What SQLAlchemy's text() would take for a bind parameter (its own pattern, in sql/elements.py)
_SA_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")


@dataclass(frozen=True)
class Statement:
    """One named statement: where it is written, its documentation and its final SQL."""

    name: str
    file: str
    doc: str
    sql: str

    @property
    def params(self) -> frozenset[str]:
        return frozenset(_PARAM.findall(self.sql))


def _blocks(path: Path) -> list[tuple[str, str, str, str]]:
    """(kind, name, doc, body) of each block of one file; text before the first is a header."""
    found: list[tuple[str, str, list[str], list[str]]] = []
    for line in path.read_text().splitlines():
        header = _HEADER.match(line)
        if header:
            found.append((header[1], header[2], [], []))
        elif found:
            _, _, doc, body = found[-1]
            if not body and line.startswith("--"):
                doc.append(line.removeprefix("--").strip())
            else:
                body.append(line)
    return [(kind, name, " ".join(doc).strip(), "\n".join(body).strip())
            for kind, name, doc, body in found]


def _expand(text: str, fragments: Mapping[str, str], where: str, depth: int = 0) -> str:
    if depth > 8:
        raise CatalogueError(f"{where}: fragments include each other in a loop")

    def include(match: re.Match[str]) -> str:
        name, alias = match[1], match[2]
        if name not in fragments:
            raise CatalogueError(f"{where}: unknown fragment {{{name}}}")
        body = fragments[name]
        if ("{alias}" in body) != (alias is not None):
            raise CatalogueError(f"{where}: fragment {name} is included as {match[0]}, "
                                 "but it " + ("needs" if alias is None else "takes no")
                                 + " table alias")
        body = body.replace("{alias}", alias) if alias is not None else body
        return _expand(body, fragments, where, depth + 1)

    return _INCLUDE.sub(include, text)


def load(folder: Path = HERE) -> tuple[dict[str, Statement], dict[str, str]]:
    """The statements (fragments included) and the fragments of ``folder``'s ``*.sql``."""
    fragments: dict[str, str] = {}
    statements: dict[str, Statement] = {}
    for path in sorted(folder.glob("*.sql")):
        for kind, name, doc, body in _blocks(path):
            if name in fragments or name in statements:
                raise CatalogueError(f"{path.name}: {name} is defined twice")
            if kind == "fragment":
                fragments[name] = body
            else:
                statements[name] = Statement(name, path.name, doc, body)
    expanded = {name: Statement(s.name, s.file, s.doc,
                                _expand(s.sql, fragments, f"{s.file}: {name}"))
                for name, s in statements.items()}
    for s in expanded.values():
        if _STRAY_PERCENT.search(_PARAM.sub("", s.sql)):
            raise CatalogueError(f"{s.file}: {s.name} has a % that is neither a %(param)s "
                                 "nor written %% (comments included: the driver reads them)")
    return expanded, fragments


_statements, _fragments = load()
STATEMENTS: Mapping[str, Statement] = MappingProxyType(_statements)
"""Every named statement, by name."""
FRAGMENTS: Mapping[str, str] = MappingProxyType(_fragments)
"""Every fragment's own text (includes not yet expanded), by name."""


def statement(name: str) -> str:
    """The SQL of statement ``name``, with psycopg's ``%(param)s`` placeholders."""
    try:
        return STATEMENTS[name].sql
    except KeyError:
        raise CatalogueError(f"no statement named {name!r} in ledger/sql/*.sql") from None


def fragment(name: str, alias: str | None = None) -> str:
    """Fragment ``name`` (for table alias ``alias`` if it takes one), for SQL composed with
    SQLAlchemy Core (``sa.literal_column``)."""
    include = f"{{{name}({alias})}}" if alias is not None else f"{{{name}}}"
    return _expand(include, FRAGMENTS, f"fragment({name!r})")


def text(name: str) -> sa.TextClause:
    """Statement ``name`` for a SQLAlchemy ``Connection``: ``:param`` placeholders (a colon
    SQLAlchemy would read as one is escaped, a ``%%`` is one ``%`` again)."""
    sql = _SA_BIND.sub(r"\\:\1", statement(name))
    return sa.text(_PARAM.sub(r":\1", sql).replace("%%", "%"))


__all__ = ["FRAGMENTS", "STATEMENTS", "Statement", "fragment", "load", "statement", "text"]
