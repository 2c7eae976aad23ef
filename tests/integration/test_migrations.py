"""The migrations build exactly ledger.schema, and processes refuse any other schema."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

import ledger as ledger_package
from console.cli import app
from console.http.errors import status_of
from ledger import Ledger
from ledger.db import HEAD_REVISION, current_revision, require_current_schema
from ledger.exceptions import SchemaMismatch
from ledger.migrate import MIGRATION_LOCK_KEY, downgrade, upgrade
from ledger.partitions import PARTITIONED
from ledger.schema import SCHEMA, VERSION_TABLE, metadata

_PARTITION = re.compile(rf"({'|'.join(PARTITIONED)})_(default|\d{{4}}_\d{{2}})")


@pytest.fixture()
def empty_engine(empty_database: str) -> Iterator[Engine]:
    engine = sa.create_engine(empty_database)
    yield engine
    engine.dispose()


def _schema_diff(engine: Engine) -> list[object]:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={
            "include_schemas": True,
            # a month's partition of a partitioned table is made at run time, not declared
            "include_name": lambda name, type_, parent: (
                name == SCHEMA if type_ == "schema"
                else type_ != "table" or not _PARTITION.fullmatch(str(name))),
            "version_table": VERSION_TABLE,
            "version_table_schema": SCHEMA,
            "compare_type": True,
        })
        return list(compare_metadata(context, metadata))


def test_migrations__empty_database_matches_schema_metadata(empty_engine: Engine) -> None:
    """Migrating an empty database yields the catalog ledger.schema declares: autogenerate
    finds no difference (tables, columns, types, indexes, constraints), at HEAD_REVISION."""
    assert current_revision(empty_engine) is None
    upgrade(empty_engine)
    assert _schema_diff(empty_engine) == []
    assert current_revision(empty_engine) == HEAD_REVISION
    require_current_schema(empty_engine)


def test_migrations__upgrade_twice_and_round_trip_through_base(empty_engine: Engine) -> None:
    """``onward db upgrade`` is idempotent, and downgrading to base then upgrading again
    rebuilds the same catalog (every migration's downgrade undoes its upgrade)."""
    upgrade(empty_engine)
    upgrade(empty_engine)
    downgrade(empty_engine, "base")
    with empty_engine.connect() as conn:
        tables = conn.execute(sa.text(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = :s "
            "AND table_name <> :v"), {"s": SCHEMA, "v": VERSION_TABLE}).scalar_one()
    assert tables == 0
    upgrade(empty_engine)
    assert _schema_diff(empty_engine) == []
    assert current_revision(empty_engine) == HEAD_REVISION


def test_schema_check__a_newer_revision_is_refused_naming_the_release_not_an_upgrade(
        empty_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database at a revision later than this code's (a newer release upgraded it) is
    refused by processes with a message naming the revision found and that a newer release
    upgraded it, not `onward db upgrade` (which cannot help: it never downgrades); and
    `onward db upgrade` of this older code refuses it with exit 2 and that message, the
    stored revision untouched, instead of failing in Alembic ("Can't locate revision")."""
    upgrade(empty_engine)
    with empty_engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {SCHEMA}.{VERSION_TABLE} SET version_num = '9999'"))
    with pytest.raises(SchemaMismatch, match=r"at revision 9999, newer than this code's") as err:
        require_current_schema(empty_engine)
    assert "onward db upgrade" not in str(err.value)
    with pytest.raises(SchemaMismatch, match="never downgrades"):
        upgrade(empty_engine)

    monkeypatch.setenv("ONWARD_DATABASE_URL", empty_engine.url.render_as_string(
        hide_password=False))
    result = CliRunner().invoke(app, ["db", "upgrade"])
    assert result.exit_code == 2, (result.output, result.exception)
    said = " ".join(result.output.split())
    assert "at revision 9999, newer than this code's" in said and "never downgrades" in said
    assert current_revision(empty_engine) == "9999"


def test_db_upgrade__two_at_once_on_an_empty_database_both_succeed_and_migrate_once(
        empty_engine: Engine) -> None:
    """Two deploy jobs running ``onward db upgrade`` at the same moment on a database with
    no schema: both exit 0, the catalog is exactly ledger.schema at HEAD_REVISION (one of
    them migrated under the advisory lock, the other then found head and did nothing)
    instead of one failing on a duplicate table or the version row being written twice."""
    url = empty_engine.url.render_as_string(hide_password=False)
    code = str(Path(ledger_package.__file__).parents[1])  # the code this test imported
    env = {**os.environ, "ONWARD_DATABASE_URL": url,
           "PYTHONPATH": os.pathsep.join(filter(None, [code, os.environ.get("PYTHONPATH")]))}
    onward = str(Path(sys.executable).parent / "onward")
    jobs = [subprocess.Popen([onward, "db", "upgrade"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [job.communicate(timeout=300)[0] for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], outputs
    assert current_revision(empty_engine) == HEAD_REVISION
    assert _schema_diff(empty_engine) == []
    with empty_engine.connect() as conn:
        assert conn.execute(sa.text(
            f"SELECT count(*) FROM {SCHEMA}.{VERSION_TABLE}")).scalar_one() == 1


def test_commands__refused_once_the_ledger_is_upgraded_under_the_process(
        ledger: Ledger) -> None:
    """A console, API server or application that was running when `onward db upgrade` ran
    (the revision is no longer its code's) writes nothing: an operator command (a signal)
    and a start are refused with SchemaMismatch naming the revision and a restart, and no
    row is written, no audit row either (a signal signed as the old code signs it would
    fail verification under the new code, which 0037 changed). Once the ledger is at the
    code's revision again, the same calls go through."""
    engine = ledger.engine
    run_id = ledger.start_run("wf_unknown", {}, allow_unadvertised=True)

    def count(table: str) -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(f"SELECT count(*) FROM onward.{table}"))
                       .scalar_one())

    def set_revision(revision: str) -> None:
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {SCHEMA}.{VERSION_TABLE} SET version_num = :v"),
                         {"v": revision})

    runs, signals, audit = count("runs"), count("signals"), count("audit")
    set_revision("9999")
    with pytest.raises(SchemaMismatch, match=r"now is at revision 9999.*restart") as err:
        ledger.signal(run_id, "go", {"by": "sam"})
    assert status_of(err.value) == (503, "ledger upgraded")  # the console's answer
    with pytest.raises(SchemaMismatch, match="nothing was written"):
        ledger.start_run("wf_unknown", {}, allow_unadvertised=True)
    assert (count("runs"), count("signals"), count("audit")) == (runs, signals, audit)

    set_revision(HEAD_REVISION)
    ledger.signal(run_id, "go", {"by": "sam"})
    assert count("signals") == signals + 1


def test_db_upgrade__a_newer_release_upgrading_first_is_refused_by_name_after_the_lock(
        empty_engine: Engine) -> None:
    """An older release's ``onward db upgrade`` that checked the revision (not newer than
    its code) and then waited on the migration lock while a newer release upgraded the
    ledger (two deploys at once) exits 2 naming the newer revision and that onward never
    downgrades, the revision untouched, instead of failing in Alembic ("Can't locate
    revision") after the lock."""
    from tests.support.cluster import wait_for

    upgrade(empty_engine)
    url = empty_engine.url.render_as_string(hide_password=False)
    code = str(Path(ledger_package.__file__).parents[1])
    env = {**os.environ, "ONWARD_DATABASE_URL": url,
           "PYTHONPATH": os.pathsep.join(filter(None, [code, os.environ.get("PYTHONPATH")]))}
    with empty_engine.connect() as holder:  # the newer release, migrating
        holder.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        holder.commit()
        job = subprocess.Popen([str(Path(sys.executable).parent / "onward"), "db", "upgrade"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        try:
            def waiting() -> bool:
                with empty_engine.connect() as conn:
                    return bool(conn.execute(sa.text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND NOT granted AND database = (SELECT oid FROM pg_database "
                        "WHERE datname = current_database())")).scalar_one())
            wait_for(waiting, timeout=60, what="the older release to wait on the lock")
            holder.execute(sa.text(f"UPDATE {SCHEMA}.{VERSION_TABLE} SET version_num = '9999'"))
            holder.commit()  # as a migration does: committed, then the lock released
            holder.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
            holder.commit()
            output = job.communicate(timeout=120)[0]
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
    said = " ".join(output.split())
    assert job.returncode == 2, output
    assert "at revision 9999, newer than this code's" in said and "never downgrades" in said
    assert current_revision(empty_engine) == "9999"
