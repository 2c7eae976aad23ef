"""Processes and the schema revision: a worker, a dispatcher and a reaper started on an
unmigrated or older database exit with a message, touching nothing; one that is running
when the database is upgraded stops taking work and exits; one started while the database
cannot be reached waits for it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from ledger import Ledger
from ledger import db as ledger_db
from ledger.db import HEAD_REVISION, current_revision
from ledger.migrate import upgrade
from ledger.schema import SCHEMA, VERSION_TABLE
from tests.support import reads
from tests.support.cluster import Cluster, Proc, wait_for
from tests.support.gate import Gate

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


def _upgrade_to(ledger: Ledger, revision: str) -> None:
    """What `onward db upgrade` to a newer release leaves: another stored revision (as
    tests/integration/test_migrations.py simulates it)."""
    with ledger.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {SCHEMA}.{VERSION_TABLE} SET version_num = :v"),
                     {"v": revision})


def _exited_naming(proc: Proc, revision: str) -> None:
    log = " ".join(proc.log().split())
    assert proc.popen.returncode == 2, log[-3000:]
    assert f"now is at revision {revision}, and this code needs {HEAD_REVISION}" in log, \
        log[-3000:]


def test_schema_check__an_upgrade_under_a_running_worker_runs_no_step_on_the_old_code(
        cluster: Cluster, ledger: Ledger) -> None:
    """Invariant (review F18): once the ledger is at another revision than a worker's code
    (`onward db upgrade` ran while it ran), that worker runs no step, even before its
    periodic check (here: once an hour) comes round: the claim statement itself refuses
    (`schema_changed`), the worker stops taking work and exits with status 2 naming the
    revision, for its supervisor to restart it on the new code. The run started after the
    upgrade has no step attempt; a worker of the matching code then completes it."""
    slow_check = {"ONWARD_SCHEMA_CHECK_S": "3600"}
    worker = cluster.worker(env=slow_check)
    dispatcher = cluster.dispatcher(env=slow_check)
    before = ledger.start_run("test_chain", {"steps": 2})
    reads.wait_run(ledger.engine, before, timeout=60, status="completed",
                   what="a run before the upgrade to complete")
    _upgrade_to(ledger, "9999")
    with pytest.MonkeyPatch.context() as new_code:  # this process plays the new release
        new_code.setattr(ledger_db, "HEAD_REVISION", "9999")
        after = ledger.start_run("test_chain", {"steps": 2})
    wait_for(lambda: not worker.alive() or reads.attempts(ledger.engine, after),
             timeout=90, what="the worker to stop (or run a step)", seen=cluster.logs)
    ran = [(a["seq"], a["outcome"]) for a in reads.attempts(ledger.engine, after)]
    assert ran == [], f"the worker of the code before the upgrade ran steps {ran}"
    wait_for(lambda: not worker.alive(), timeout=60, what="the worker to stop",
             seen=cluster.logs)
    _exited_naming(worker, "9999")
    assert reads.run_row(ledger.engine, after)["stale_deliveries"] >= 1
    dispatcher.stop()

    _upgrade_to(ledger, HEAD_REVISION)  # the new code's processes (here: the same code)
    cluster.worker()
    cluster.dispatcher()
    reads.wait_run(ledger.engine, after, timeout=90, status="completed",
                   what="the run to complete on code of the ledger's revision")


def test_schema_check__an_upgrade_stops_idle_workers_dispatchers_and_reapers(
        cluster: Cluster, ledger: Ledger) -> None:
    """Invariant (review F18): a worker, dispatcher and reaper that take no work notice an
    upgrade within ONWARD_SCHEMA_CHECK_S (1 s here) and exit with status 2, naming the
    revision found and the one their code needs."""
    fast_check = {"ONWARD_SCHEMA_CHECK_S": "1"}
    procs = [cluster.worker(env=fast_check), cluster.dispatcher(env=fast_check),
             cluster.reaper(env=fast_check)]
    wait_for(lambda: all("started" in p.log() or p.ready() for p in procs), timeout=60,
             what="every process to start", seen=cluster.logs)
    _upgrade_to(ledger, "9999")
    wait_for(lambda: not any(p.alive() for p in procs), timeout=60,
             what="every process to stop", seen=cluster.logs)
    for proc in procs:
        _exited_naming(proc, "9999")


def test_schema_check__processes_started_while_postgres_is_down_wait_for_it(
        cluster: Cluster, ledger: Ledger, settings_env: dict[str, str]) -> None:
    """Invariant (chaos finding 3): a worker, dispatcher and reaper started while the
    ledger database cannot be reached wait for it, retrying with backoff and logging what
    they wait for, instead of exiting; once it answers they start and run steps."""
    gate = Gate(settings_env["ONWARD_DATABASE_URL"])
    down = {"ONWARD_DATABASE_URL": gate.url}
    procs = [cluster.worker(env=down, wait_ready=False), cluster.dispatcher(env=down),
             cluster.reaper(env=down)]
    try:
        wait_for(lambda: all(p.log().count("waiting for the ledger database") >= 2
                             for p in procs), timeout=60,
                 what="every process to wait for the database", seen=cluster.logs)
        assert all(p.alive() for p in procs), cluster.logs()
        assert gate.accepted == 0
        gate.open()
        wait_for(lambda: procs[0].ready() or not procs[0].alive(), timeout=90,
                 what="the worker to be ready", seen=cluster.logs)
        run_id = ledger.start_run("test_chain", {"steps": 3})
        reads.wait_run(ledger.engine, run_id, timeout=90, status="completed",
                       what="the run to complete")
        assert all(p.alive() for p in procs), cluster.logs()
        assert gate.accepted > 0
    finally:
        cluster.stop_all()
        gate.close()
