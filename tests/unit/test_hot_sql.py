"""The hot path's statements in PostgreSQL's positional form (ledger/hot.py)."""

from __future__ import annotations

import pytest

from ledger.hot import positional
from ledger.sql import STATEMENTS


def test_positional__numbers_names_in_order_of_first_use() -> None:
    query, names = positional("SELECT %(b)s, %(a)s, %(b)s::int, 'x%%y'")
    assert query == b"SELECT $1, $2, $1::int, 'x%y'"
    assert names == ("b", "a")


def test_positional__a_lone_percent_is_refused() -> None:
    with pytest.raises(ValueError, match="lone %"):
        positional("SELECT 5 % 2")


def test_positional__every_catalogue_statement_converts() -> None:
    """Each statement of the catalogue converts, whatever its length (psycopg itself parses
    statements over 4 KB again on every call), naming each of its parameters once."""
    for name, found in STATEMENTS.items():
        query, names = positional(found.sql)
        assert b"%(" not in query, name
        assert set(names) == found.params, name
        assert len(names) == len(set(names)), name
    assert len(STATEMENTS) > 10
