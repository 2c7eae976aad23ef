"""Processes refuse a database at another schema revision: a worker, a dispatcher and a
reaper started on an unmigrated or older database exit with a message, touching nothing."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from ledger.db import HEAD_REVISION, current_revision
from ledger.migrate import upgrade
from ledger.schema import SCHEMA
from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.acceptance


def test_schema_check__processes_refuse_to_start_on_an_unmigrated_database(
        empty_database: str, cluster: Cluster) -> None:
    """A worker, a dispatcher and a reaper started on a database without the onward schema
    exit with status 2 and a message naming `onward db upgrade`; none touches the database
    or the broker (no schema is created behind the operator's back)."""
    env = {"ONWARD_DATABASE_URL": empty_database}
    procs = [cluster.worker(env=env, wait_ready=False), cluster.dispatcher(env=env),
             cluster.reaper(env=env)]
    wait_for(lambda: not any(p.alive() for p in procs), timeout=90,
             what="every process to refuse and exit", seen=cluster.logs)
    for proc in procs:
        log = " ".join(proc.log().split())  # the CLI wraps long error lines
        assert proc.popen.returncode == 2, log
        assert "onward db upgrade" in log, log
        assert "has no onward schema" in log, log
        assert "ready." not in log
    engine = sa.create_engine(empty_database)
    try:
        assert current_revision(engine) is None
        with engine.connect() as conn:
            assert conn.execute(sa.text(
                "SELECT count(*) FROM information_schema.schemata WHERE schema_name = :s"),
                {"s": SCHEMA}).scalar_one() == 0
    finally:
        engine.dispose()


def test_schema_check__processes_refuse_to_start_on_an_older_revision(
        empty_database: str, cluster: Cluster) -> None:
    """On a database left at an older revision (an upgrade not yet run after a deploy), a
    worker and a dispatcher exit with status 2 naming the revision found, the one needed and
    `onward db upgrade`; the stored revision is left as it was."""
    engine = sa.create_engine(empty_database)
    try:
        upgrade(engine, "0001")
        env = {"ONWARD_DATABASE_URL": empty_database}
        procs = [cluster.worker(env=env, wait_ready=False), cluster.dispatcher(env=env)]
        wait_for(lambda: not any(p.alive() for p in procs), timeout=90,
                 what="every process to refuse and exit", seen=cluster.logs)
        for proc in procs:
            log = " ".join(proc.log().split())
            assert proc.popen.returncode == 2, log
            assert f"is at revision 0001, this code needs {HEAD_REVISION}" in log, log
            assert "onward db upgrade" in log, log
        assert current_revision(engine) == "0001"
    finally:
        engine.dispose()
