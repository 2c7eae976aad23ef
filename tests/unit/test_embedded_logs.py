"""Starting or finding the embedded PostgreSQL prints nothing an operator must read:
pgserver's INFO lines (initdb skipped, a server already running, its postmaster's details)
came before ``onward console``'s login link and in every worker's log."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest

from ledger import embedded


class _Server:
    def get_uri(self, database: str) -> str:
        return f"postgresql://postgres:@/{database}?host=/tmp/x"


def _fake_pgserver(**_kwargs: object) -> _Server:
    logging.getLogger("pgserver").info("PG_VERSION file found, skipping initdb")
    logging.getLogger("pgserver").warning("something an operator should see")
    return _Server()


def test_embedded__pgserver_info_lines_are_not_shown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Invariant: pgserver logs warnings only (unless its level was set); the URL is
    psycopg's."""
    fake = types.ModuleType("pgserver")
    fake.get_server = lambda pgdata, cleanup_mode=None: _fake_pgserver()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pgserver", fake)
    monkeypatch.setattr(logging.getLogger("pgserver"), "level", logging.NOTSET)
    with caplog.at_level(logging.INFO):
        url = embedded.postgres_url(tmp_path)
    assert url.startswith("postgresql+psycopg://")
    assert [r.getMessage() for r in caplog.records if r.name == "pgserver"] == [
        "something an operator should see"]
