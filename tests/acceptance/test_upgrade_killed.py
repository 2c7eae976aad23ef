"""``onward db upgrade`` SIGKILLed inside the migration, on a ledger full of runs.

ledger/migrations/env.py applies every pending revision in one transaction, under the
migration advisory lock: PostgreSQL's DDL is transactional, so a deploy job killed halfway
(a CI timeout, an OOM kill, a node lost) leaves the ledger exactly at the revision it had,
and the next ``onward db upgrade`` starts over. Here the real command runs as a subprocess
on a ledger taken back to 0044 and is held inside its transaction, after 0045 and 0046 ran
in it, by a lock this test holds on the table 0047 alters; it is SIGKILLed there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import ledger as ledger_package
from ledger import Ledger, RunStatus
from ledger.db import HEAD_REVISION, current_revision
from ledger.migrate import MIGRATION_LOCK_KEY, downgrade
from ledger.vocabulary import Role
from tasks.waiting import artifact_hash
from tests.integration.test_migrations_populated import MODULES, _stopped_runs
from tests.support.cluster import wait_for
from tests.support.corpus import ops_driver, table_digest
from tests.support.driver import Driver
from tests.workflows_ops import calls

pytestmark = pytest.mark.acceptance

OLD = "0044"  # 0045 indexes evidence, 0046 adds evidence.request, 0047 alters effects
BLOCKED_AT = "ALTER TABLE onward.effects ADD COLUMN recipient_mac"


@pytest.fixture()
def drv(ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    with ops_driver(ledger, tmp_path / "tool.log", monkeypatch, MODULES) as running:
        yield running


def _onward(url: str, *args: str) -> subprocess.Popen[str]:
    """The real ``onward`` command, on the code this test imported, against ``url``."""
    code = str(Path(ledger_package.__file__).parents[1])
    env = {**os.environ, "ONWARD_DATABASE_URL": url, "ONWARD_AUTH": "off",
           "PYTHONPATH": os.pathsep.join(filter(None, [code, os.environ.get("PYTHONPATH")]))}
    env.pop("ONWARD_TOKEN", None)
    onward = str(Path(sys.executable).parent / "onward")
    return subprocess.Popen([onward, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _catalog(engine: sa.engine.Engine) -> dict[str, list[tuple[Any, ...]]]:
    """The ledger schema's catalog: columns, indexes, constraints, functions (their
    source), each sorted; equal before and after means no DDL stayed."""
    queries = {
        "columns": "SELECT table_name, column_name, data_type, is_nullable, column_default "
                   "FROM information_schema.columns WHERE table_schema = 'onward'",
        "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes "
                   "WHERE schemaname = 'onward'",
        "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(c.oid) "
                       "FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace "
                       "WHERE n.nspname = 'onward'",
        "functions": "SELECT proname, md5(prosrc) FROM pg_proc p JOIN pg_namespace n "
                     "ON n.oid = p.pronamespace WHERE n.nspname = 'onward'",
    }
    with engine.connect() as conn:
        return {name: sorted(tuple(row) for row in conn.execute(sa.text(query)))
                for name, query in queries.items()}


def _upgrade_backend(engine: sa.engine.Engine) -> dict[str, Any] | None:
    """The upgrade's server process once it waits for the lock on effects, with what it
    holds: the migration lock, and 0046's exclusive lock on evidence (its transaction)."""
    with engine.connect() as conn:
        row = conn.execute(sa.text(
            "SELECT a.pid, a.query FROM pg_stat_activity a WHERE a.datname = current_database() "
            "AND a.wait_event_type = 'Lock' AND a.query LIKE :q"),
            {"q": f"{BLOCKED_AT}%"}).mappings().first()
        if row is None:
            return None
        held = conn.execute(sa.text(
            "SELECT locktype, coalesce(relation::regclass::text, objid::text) AS what, mode "
            "FROM pg_locks WHERE pid = :pid AND granted"), {"pid": row["pid"]}).all()
    return {"pid": row["pid"], "held": {(t, w, m) for t, w, m in held}}


def _migration_lock_holders(engine: sa.engine.Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND ((classid::bigint << 32) | objid::bigint) = :k"),
            {"k": MIGRATION_LOCK_KEY}).scalars())


def _backend_alive(engine: sa.engine.Engine, pid: int) -> bool:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"),
                            {"p": pid}).scalar_one() > 0


def _finish(drv: Driver, runs: dict[str, Any]) -> None:
    """Let each stopped run go on (approve, signal, continue, the old lease lapses) and
    drive every run to its end with the real executor."""
    ledger = drv.ledger
    approval = ledger.approvals(run_id=runs["awaiting_approval"])[0]
    ledger.acting_as("ann", Role.APPROVER).approve(
        approval.id, artifact_hash=artifact_hash(approval.artifact))
    assert ledger.signal(runs["awaiting_signal"], "go", {"by": "sue"})
    ledger.continue_run(runs["failed"], "the template is fixed")
    with ledger.engine.begin() as conn:
        conn.execute(sa.text("UPDATE onward.runs SET lease_expires_at = onward.now() "
                             "- interval '1 second' WHERE id = :id"), {"id": runs["leased"]})
    for name, run_id in runs.items():
        assert drv.drive(run_id).status is RunStatus.COMPLETED, name


@pytest.mark.parametrize("blocker", ["ends_first", "stays"])
def test_db_upgrade__killed_inside_the_migration_leaves_the_old_revision_and_resumes(
        drv: Driver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, blocker: str) -> None:
    """Invariant: ``onward db upgrade`` SIGKILLed while its transaction has applied 0045
    and 0046 and waits inside 0047 changes nothing: once its server process is gone the
    ledger is at 0044 with the same catalog and the same rows, and the migration lock is
    free; a second ``onward db upgrade`` then brings it to head, ``onward verify --all``
    passes, and every run (waiting, decided, failed, queued, leased, an effect pending, an
    effect completed and not committed, completed) ends once, each effect called once.
    The server process ends even while what blocked it goes on holding its lock
    (``stays``: a long transaction on effects), so the next upgrade is not left waiting on
    the migration lock of an upgrade that no longer exists."""
    ledger = drv.ledger
    engine = ledger.engine
    url = engine.url.render_as_string(hide_password=False)
    runs = _stopped_runs(drv, monkeypatch)
    called = calls(tmp_path / "tool.log")
    downgrade(engine, OLD)
    catalog, rows = _catalog(engine), table_digest(engine)

    holder = engine.connect()
    holder.execute(sa.text("LOCK TABLE onward.effects IN ACCESS SHARE MODE"))
    upgrading = _onward(url, "db", "upgrade")
    try:
        backend = wait_for(lambda: _upgrade_backend(engine), timeout=120,
                           what="the upgrade to wait inside 0047",
                           seen=lambda: upgrading.poll())
        assert backend["pid"] in _migration_lock_holders(engine)
        assert ("relation", "onward.evidence", "AccessExclusiveLock") in backend["held"]
        os.kill(upgrading.pid, signal.SIGKILL)
        assert upgrading.wait(timeout=30) == -signal.SIGKILL
        if blocker == "stays":
            wait_for(lambda: not _backend_alive(engine, backend["pid"]), timeout=30,
                     what="the killed upgrade's server process to end, still blocked",
                     seen=lambda: _upgrade_backend(engine))
            assert _migration_lock_holders(engine) == []
    finally:
        holder.rollback()
        holder.close()
    wait_for(lambda: not _backend_alive(engine, backend["pid"]), timeout=60,
             what="the killed upgrade's server process to end")

    assert current_revision(engine) == OLD
    assert _catalog(engine) == catalog
    assert table_digest(engine) == rows
    assert _migration_lock_holders(engine) == []

    again = _onward(url, "db", "upgrade")
    output = again.communicate(timeout=300)[0]
    assert again.returncode == 0, output
    assert current_revision(engine) == HEAD_REVISION
    verified = _onward(url, "verify", "--all")
    output = verified.communicate(timeout=300)[0]
    assert verified.returncode == 0, output

    _finish(drv, runs)
    assert {name: ledger.verify_run(run_id) for name, run_id in runs.items()} == {
        name: [] for name in runs}
    every = calls(tmp_path / "tool.log")
    keys = [line.split("\t")[1] for line in every]
    assert len(keys) == len(set(keys)), every
    assert every[:len(called)] == called
