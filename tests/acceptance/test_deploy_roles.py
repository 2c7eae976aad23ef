"""The database roles of the deployment (compose.yaml, deploy/postgres/initdb), on a real
PostgreSQL cluster of this test's own with password authentication.

The compose stack cannot run here (no Docker engine): this runs what it runs. The init script
the postgres image executes on its first start, as the superuser over the Unix socket;
``onward db upgrade`` as ``onward_owner`` over TCP with its password, as the ``migrate``
service does; then each role logs in with its password and can do what its services need
and no more: the owner owns every table without being a superuser; onward_app and
onward_operator own nothing, create nothing, and onward_app sees no row without a tenant.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from harness.postgres import SUPERUSER, PrivatePostgres, bin_dir

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
INIT = ROOT / "deploy" / "postgres" / "initdb" / "10-onward-roles.sh"
PASSWORDS = {"onward_owner": "owner-pw", "onward_app": "app-pw", "onward_operator": "op-pw"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres(prefix="onward-deploy-pg-").init()
    # as the postgres image sets it up: trust on the socket (its init scripts), passwords
    # over TCP (every service)
    (pg.data / "pg_hba.conf").write_text("local all all trust\n"
                                         "host all all 127.0.0.1/32 scram-sha-256\n")
    try:
        pg.start()
        with psycopg.connect(host=str(pg.root), port=pg.port, user=SUPERUSER,
                             dbname="postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE onward")  # the image's POSTGRES_DB
        env = {**os.environ, "PGHOST": str(pg.root), "PGPORT": str(pg.port),
               "PATH": f"{bin_dir()}:{os.environ['PATH']}",
               "POSTGRES_USER": SUPERUSER, "POSTGRES_DB": "onward",
               "ONWARD_OWNER_DB_PASSWORD": PASSWORDS["onward_owner"],
               "ONWARD_APP_DB_PASSWORD": PASSWORDS["onward_app"],
               "ONWARD_OPERATOR_DB_PASSWORD": PASSWORDS["onward_operator"]}
        done = subprocess.run(["sh", str(INIT)], env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        yield pg
    finally:
        pg.destroy()


def _url(pg: PrivatePostgres, role: str, password: str | None = None) -> str:
    return (f"postgresql://{role}:{password or PASSWORDS[role]}@127.0.0.1:{pg.port}/onward")


def _upgrade(pg: PrivatePostgres, role: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ONWARD_DATABASE_URL": _url(pg, role)}
    return subprocess.run([str(Path(sys.executable).parent / "onward"), "db", "upgrade"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def migrated(cluster: PrivatePostgres) -> PrivatePostgres:
    done = _upgrade(cluster, "onward_owner")
    assert done.returncode == 0, done.stdout + done.stderr
    return cluster


def test_deploy_roles__owner_migrates_and_owns_every_table_without_superuser(
        migrated: PrivatePostgres) -> None:
    """``migrate`` (the owner) upgrades the schema; every table is the owner's; the owner is
    not a superuser but bypasses row-level security (a migration rewriting rows sees all)."""
    with psycopg.connect(_url(migrated, "onward_owner")) as conn:
        owners = dict(conn.execute(
            "SELECT c.relname, pg_get_userbyid(c.relowner) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'onward' AND c.relkind IN ('r', 'p')").fetchall())
        roles = {r[0]: r[1:] for r in conn.execute(
            "SELECT rolname, rolsuper, rolbypassrls, rolcreaterole FROM pg_roles "
            "WHERE rolname LIKE 'onward_%'").fetchall()}
    assert len(owners) > 20 and set(owners.values()) == {"onward_owner"}, owners
    assert roles == {"onward_owner": (False, True, False),
                     "onward_app": (False, False, False),
                     "onward_operator": (False, False, False)}


@pytest.mark.parametrize("role", ["onward_app", "onward_operator"])
def test_deploy_roles__service_roles_log_in_with_their_password_and_create_nothing(
        migrated: PrivatePostgres, role: str) -> None:
    """The services' roles log in with the password from the environment (a wrong one is
    refused), read the ledger, and cannot create a table."""
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(_url(migrated, role, "wrong")).close()
    with psycopg.connect(_url(migrated, role)) as conn:
        conn.execute("SELECT count(*) FROM onward.runs").fetchone()
        for schema in ("onward", "public"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"CREATE TABLE {schema}.mine (x int)")
            conn.rollback()


def test_deploy_roles__app_without_a_tenant_sees_nothing_operator_sees_all(
        migrated: PrivatePostgres) -> None:
    """A row the owner writes for a tenant: onward_app sees it only with that tenant set,
    onward_operator always (the console's and the workers' views of the same row)."""
    with psycopg.connect(_url(migrated, "onward_owner")) as conn:
        conn.execute("INSERT INTO onward.audit_heads (tenant_id, chain_seq, chain_mac, mac) "
                     "VALUES ('acme', 0, 'k:x', 'k:x')")
    with psycopg.connect(_url(migrated, "onward_app")) as conn:
        assert conn.execute("SELECT count(*) FROM onward.audit_heads").fetchone() == (0,)
        conn.execute("SELECT set_config('onward.tenant', 'globex', true)")
        assert conn.execute("SELECT count(*) FROM onward.audit_heads").fetchone() == (0,)
        conn.execute("SELECT set_config('onward.tenant', 'acme', true)")
        assert conn.execute("SELECT count(*) FROM onward.audit_heads").fetchone() == (1,)
    with psycopg.connect(_url(migrated, "onward_operator")) as conn:
        assert conn.execute("SELECT count(*) FROM onward.audit_heads").fetchone() == (1,)
