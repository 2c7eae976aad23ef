"""``onward db status`` against a database the code does not match says what to run."""

from __future__ import annotations

from typer.testing import CliRunner

from console.cli import app
from ledger.db import HEAD_REVISION

__all__: list[str] = []


def test_db_status__a_database_behind_the_code_names_the_upgrade(empty_database: str) -> None:
    """An empty (or older) schema exits 2 and names ``onward db upgrade``; it said only
    'database: 0045   code needs: 0046'."""
    shown = CliRunner().invoke(app, ["db", "status"],
                               env={"ONWARD_DATABASE_URL": empty_database, "COLUMNS": "200"})
    assert shown.exit_code == 2, shown.output
    assert f"code needs: {HEAD_REVISION}" in shown.output
    assert "onward db upgrade" in shown.output
