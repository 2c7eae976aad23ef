"""A JSON column that is absent is SQL NULL wherever onward writes it, not JSON ``null``:
SQL reads JSON ``null`` as a value (``cancel_requested IS NOT NULL`` is a cancel request,
which the claim, the commit and every ``ctx`` call honour). Writes through SQLAlchemy
(corpus import, continue, forks) stored Python None as JSON ``null`` (review F23).
Real PostgreSQL; runs recorded in-process through the real executor."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from ledger import Ledger, OnwardSettings, RunStatus
from ledger.bundle import read_bundle
from ledger.corpora import Corpora
from ledger.corpus import Selection
from ledger.schema import metadata
from tests.support.corpus import empty_database, ops_driver, other_ledger, record_note
from tests.support.driver import Driver

TABLES = ("runs", "checkpoints", "evidence", "effects", "effect_attempts", "approvals",
          "signals", "step_attempts", "audit")


@pytest.fixture()
def drv(ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    with ops_driver(ledger, tmp_path / "tool.log", monkeypatch) as running:
        yield running


@pytest.fixture()
def second_url(server_urls: dict[str, str], template_database: str) -> Iterator[str]:
    with empty_database(server_urls, template_database, "onward_nulls") as url:
        yield url


def _json_nulls(engine: sa.engine.Engine, run_ids: list[UUID]) -> dict[str, int]:
    """Per nullable JSON column of the runs' rows: how many hold JSON ``null``."""
    found: dict[str, int] = {}
    with engine.connect() as conn:
        for name in TABLES:
            table = metadata.tables[f"onward.{name}"]
            key = "id" if name == "runs" else "run_id"
            if key not in table.columns:
                continue
            for column in table.columns:
                if not (isinstance(column.type, JSONB) and column.nullable):
                    continue
                found[f"{name}.{column.name}"] = conn.execute(sa.text(
                    f"SELECT count(*) FROM onward.{name} WHERE {key} = ANY(:ids) "
                    f"AND {column.name} = 'null'::jsonb"), {"ids": run_ids}).scalar_one()
    return {column: n for column, n in found.items() if n}


def _failed(drv: Driver, monkeypatch: pytest.MonkeyPatch) -> UUID:
    monkeypatch.setenv("ONWARD_TEST_OPS_BROKEN", "1")
    run_id = drv.ledger.start_run("test_ops_fragile", {})
    assert drv.drive(run_id).status is RunStatus.FAILED
    monkeypatch.delenv("ONWARD_TEST_OPS_BROKEN")
    return run_id


def test_import__keeps_sql_nulls_and_brings_no_cancel_request(
        drv: Driver, second_url: str, settings: OnwardSettings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a bundle carries every column as stored; an imported run's absent JSON
    values stay SQL NULL in every table, so no imported run carries a cancel request nobody
    made (it carried one on every run: the step's first ``ctx`` call cancelled it)."""
    runs = [record_note(drv, "kept", approve=True), _failed(drv, monkeypatch)]
    corpora = Corpora(drv.ledger)
    corpora.add("c", Selection(run_ids=tuple(runs)))
    out = io.BytesIO()
    corpora.export("c", out)
    assert _json_nulls(drv.ledger.engine, runs) == {}
    with other_ledger(second_url, settings) as target:
        Corpora(target).import_bundle(read_bundle(out.getvalue(), drv.ledger.keys))
        assert _json_nulls(target.engine, runs) == {}
        with target.engine.connect() as conn:
            cancelled = conn.execute(sa.text(
                "SELECT count(*) FROM onward.runs WHERE cancel_requested IS NOT NULL"
            )).scalar_one()
        assert cancelled == 0


def test_continue_and_forks__write_sql_nulls(drv: Driver,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: continue clears a run's error to SQL NULL, and a replay or branch starts
    with no error, patch, result or cancel request (SQL NULL), like a run started anew."""
    failed = _failed(drv, monkeypatch)
    drv.ledger.continue_run(failed, "the template is fixed")
    done = record_note(drv, "forked")
    replay = drv.ledger.replay(done, 0, "evidence", "look").run_id
    branch = drv.ledger.branch(done, 0, [{"op": "replace", "path": "/topic", "value": "x"}],
                               "try again").run_id
    assert _json_nulls(drv.ledger.engine, [failed, replay, branch]) == {}
