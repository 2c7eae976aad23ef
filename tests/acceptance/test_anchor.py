"""A real ``onward reaper`` process anchors the ledger on schedule, and stops anchoring (and
says why) when pointed at an older copy of the database."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from harness.databases import create_database, drop_database
from ledger import Ledger
from ledger.anchor import decode
from ledger.anchor_store import DirectoryStore
from tests.support.cluster import Cluster, wait_for
from tests.support.driver import driver

pytestmark = pytest.mark.acceptance

MODULES = ["tests.workflows_anchor"]


def test_reaper__anchors_every_interval_and_not_an_older_copy(
        cluster: Cluster, ledger: Ledger, settings_env: dict[str, str],
        server_urls: dict[str, str], tmp_path: Path) -> None:
    """Invariant: a reaper with ONWARD_ANCHOR_LOCATION writes an anchor every
    ONWARD_ANCHOR_INTERVAL_S holding every run's head (its seq as committed); a reaper on a
    restored older copy of the database writes none (the rollback would be accepted
    silently otherwise) and logs the run that moved back."""
    location = tmp_path / "anchors"
    env = {"ONWARD_ANCHOR_LOCATION": str(location), "ONWARD_ANCHOR_INTERVAL_S": "1"}
    store = DirectoryStore(location)
    with driver(ledger, MODULES) as drv:
        run_id = ledger.start_run("test_anchor_notes", {})
        drv.step(run_id, 0)
        drv.store.close()
        ledger.engine.dispose()
        copy, copy_url = create_database(server_urls["database"], "onward_copy",
                                         template=make_url(ledger.url).database)
        try:
            reaper = cluster.reaper(env=env)
            wait_for(lambda: len(store.names()) >= 2, timeout=60, what="two anchors")
            for seq in (1, 2):
                drv.step(run_id, seq)

            def anchored_seq() -> int:
                name = store.names()[-1]
                return decode(ledger.keys, name, store.read(name)).heads[0].seq

            wait_for(lambda: anchored_seq() == 3, timeout=60, what="an anchor at seq 3")
            reaper.stop()
            written = len(store.names())
            older = cluster.reaper(env={**env, "ONWARD_DATABASE_URL": copy_url})
            wait_for(lambda: older.log().count("not anchored") >= 2, timeout=60,
                     what="the reaper on the copy to refuse twice")
            assert len(store.names()) == written
            assert str(run_id) in older.log()
            older.stop()
        finally:
            drop_database(server_urls["database"], copy)
