"""The scratch database an offline corpus replay uses (ledger/scratch.py): a database the
operator names is used only when it holds no onward schema, and a refusal touches nothing."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from ledger import Ledger, OnwardSettings
from ledger.exceptions import OperationRefused
from ledger.scratch import scratch_database


def test_scratch__a_url_naming_a_ledger_is_refused_and_left_untouched(
        ledger: Ledger, settings: OnwardSettings, database: str) -> None:
    """Invariant (docs: the source ledger is never written by a replay): given the URL of a
    database that holds a ledger, the replay refuses and every run stays (found by review:
    the refusal sat inside a `try` whose `finally` dropped the ledger's whole schema)."""
    run_id = ledger.start_run("test_chain", {"steps": 1})
    with pytest.raises(OperationRefused, match="already holds an onward schema"), \
            scratch_database(settings, url=database):
        pass
    assert ledger.get_run(run_id) is not None


def test_scratch__an_empty_database_named_is_used_then_emptied(
        settings: OnwardSettings, empty_database: str) -> None:
    """A named empty database gets the onward schema for the replay and loses it after."""
    with scratch_database(settings, url=empty_database) as url:
        inside = sa.create_engine(url)
        with inside.connect() as conn:
            assert conn.execute(sa.text("SELECT to_regnamespace('onward')")).scalar()
        inside.dispose()
    engine = sa.create_engine(empty_database)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT to_regnamespace('onward')")).scalar() is None
    engine.dispose()
