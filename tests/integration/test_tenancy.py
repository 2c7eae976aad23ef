"""Tenants isolated by the database (issue 15 item 2): row-level security, forced, on every
table of tenant data, keyed on the transaction's ``onward.tenant``. The application connects
as ``onward_app`` (owns nothing, no BYPASSRLS); the steps run as a worker connected as
``onward_operator``, the explicit cross-tenant role. Real PostgreSQL; runs of two tenants
recorded in-process through the real executor (model call, effects, an approval, audit)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from uuid import UUID

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from ledger import Ledger, OnwardSettings, RunStatus
from ledger.exceptions import UnknownApproval, UnknownRun
from ledger.tokens import TokenRequest
from ledger.vocabulary import Role
from tests.support.driver import driver
from tests.support.plans import sent_by

APP, OPERATOR = "onward_app", "onward_operator"
TENANTS = ("acme", "globex")
MODULES = ["tests.workflows_ops"]

OWN = ("runs", "approvals", "effects", "audit", "corpora", "corpus_runs", "tokens")
"""Tables whose rows name their tenant."""
OF_RUN = ("checkpoints", "step_attempts", "evidence", "signals", "outbox", "call_retries",
          "limit_grants", "limit_waiters")
"""Tables whose rows belong to a run (and so to its tenant)."""
PROTECTED = (*OWN, "audit_heads", *OF_RUN, "effect_attempts", "artifacts")
UNPROTECTED = {"workers", "worker_queues", "metric_totals", "limits", "onward_alembic_version"}
"""The fleet (its workers, its limits), cross-tenant counters and the schema revision: no
tenant's data."""
RECORDED = ("runs", "checkpoints", "step_attempts", "evidence", "effects", "effect_attempts",
            "approvals", "audit", "tokens", "signals", "artifacts")
"""What the runs below leave in every tenant (a test that finds none of it proves nothing)."""


def as_role(url: str, role: str) -> str:
    return make_url(url).set(username=role).render_as_string(hide_password=False)


@dataclass
class Tenants:
    runs: dict[str, UUID]  # tenant -> its run
    app: Engine  # connected as onward_app
    owner: Engine  # connected as the migrations' role (a superuser here: sees everything)

    def ledger(self, settings: OnwardSettings, tenant: str) -> Ledger:
        return Ledger(self.app, settings).acting_as("olga", Role.ADMIN, tenant_id=tenant)


@pytest.fixture()
def tenants(database: str, settings: OnwardSettings, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Tenants]:
    monkeypatch.setenv("ONWARD_TEST_OPS_CALLS", str(tmp_path / "tool.log"))
    app, owner = sa.create_engine(as_role(database, APP)), sa.create_engine(database)
    made = Tenants({}, app, owner)
    try:
        for tenant in TENANTS:
            ledger = made.ledger(settings, tenant)
            with driver(ledger, MODULES, worker_url=as_role(database, OPERATOR),
                        state_inline_bytes=64) as drv:  # states stored as artifacts
                run_id = ledger.start_run("test_ops_notes", {"approve": True})
                assert drv.drive(run_id).status is RunStatus.WAITING
                ledger.signal(run_id, "early", {"note": tenant})  # kept, never consumed
                asked = ledger.approvals(run_id=run_id)[0]
                ledger.approve(asked.id, artifact_hash=asked.artifact_hash, comment="ok")
                assert drv.drive(run_id).status is RunStatus.COMPLETED
                ledger.create_token(TokenRequest("viv", Role.VIEWER, tenant,
                                                 ttl=timedelta(hours=1)))
            made.runs[tenant] = run_id
        yield made
    finally:
        app.dispose()
        owner.dispose()


def _count(conn: sa.Connection, table: str) -> int:
    return int(conn.execute(sa.text(f"SELECT count(*) FROM onward.{table}")).scalar_one())


def _counts_of(engine: Engine, tenant: str | None) -> dict[str, int]:
    with engine.begin() as conn:
        if tenant is not None:
            conn.execute(sa.text("SELECT set_config('onward.tenant', :t, true)"), {"t": tenant})
        return {table: _count(conn, table) for table in PROTECTED}


def _owner_counts(tenants: Tenants, tenant: str) -> dict[str, int]:
    """What the tenant holds, counted by the owner with explicit filters."""
    runs = "(SELECT id FROM onward.runs WHERE tenant_id = :t)"
    where = {table: "tenant_id = :t" for table in (*OWN, "audit_heads")}
    where.update({table: f"run_id IN {runs}" for table in OF_RUN})
    where["effect_attempts"] = ("(effect_type, effect_id) IN (SELECT effect_type, effect_id "
                                "FROM onward.effects WHERE tenant_id = :t)")
    where["artifacts"] = (
        f"sha256 IN (SELECT artifact_sha256 FROM onward.evidence WHERE run_id IN {runs}) OR "
        f"sha256 IN (SELECT request_hash FROM onward.evidence WHERE run_id IN {runs}) OR "
        f"sha256 IN (SELECT state -> '$artifact' ->> 'sha256' FROM onward.checkpoints "
        f"WHERE run_id IN {runs})")
    with tenants.owner.connect() as conn:
        return {table: int(conn.execute(sa.text(
            f"SELECT count(*) FROM onward.{table} WHERE {condition}"), {"t": tenant}
        ).scalar_one()) for table, condition in where.items()}


def test_a_tenant_reads_exactly_its_own_rows(tenants: Tenants) -> None:
    """Invariant: with ``onward.tenant`` set, onward_app sees in every table of tenant data
    exactly the rows of that tenant (counted by the owner with explicit filters)."""
    for tenant in TENANTS:
        mine = _owner_counts(tenants, tenant)
        assert all(mine[table] > 0 for table in RECORDED), mine
        assert _counts_of(tenants.app, tenant) == mine


def test_an_unset_tenant_sees_no_rows(tenants: Tenants) -> None:
    """Invariant: fails closed. A transaction that sets no tenant (or an empty one) sees no
    row of any protected table, also on a pooled connection whose previous transaction set
    one (the setting lasts one transaction)."""
    with tenants.owner.connect() as conn:
        assert all(_count(conn, table) > 0 for table in RECORDED)
    assert _counts_of(tenants.app, "acme")["runs"] == 1
    assert set(_counts_of(tenants.app, None).values()) == {0}
    assert set(_counts_of(tenants.app, "").values()) == {0}
    assert set(_counts_of(tenants.app, "nobody").values()) == {0}


def test_a_tenant_changes_only_its_own_rows(tenants: Tenants) -> None:
    """Invariant: updates and deletes of another tenant's rows touch nothing; inserting a
    row for another tenant, into another tenant's run, or moving one's own row to another
    tenant is refused by the database."""
    theirs = tenants.runs["globex"]
    touch = [
        ("UPDATE onward.runs SET status = 'cancelled' WHERE id = :r", {"r": theirs}),
        ("UPDATE onward.approvals SET comment = 'x' WHERE run_id = :r", {"r": theirs}),
        ("UPDATE onward.effects SET status = 'failed' WHERE run_id = :r", {"r": theirs}),
        ("DELETE FROM onward.evidence WHERE run_id = :r", {"r": theirs}),
        ("DELETE FROM onward.audit WHERE tenant_id = 'globex'", {}),
        ("DELETE FROM onward.checkpoints WHERE run_id = :r", {"r": theirs}),
        ("DELETE FROM onward.artifacts", {}),
    ]
    before = _owner_counts(tenants, "globex")
    for statement, params in touch:
        with tenants.app.begin() as conn:
            conn.execute(sa.text("SELECT set_config('onward.tenant', 'acme', true)"))
            assert conn.execute(sa.text(statement), params).rowcount == 0, statement
    assert _owner_counts(tenants, "globex") == before
    refused = [
        "INSERT INTO onward.runs (id, tenant_id, workflow, status, max_attempts, head_hash) "
        "VALUES (gen_random_uuid(), 'globex', 'w', 'running', 1, 'h')",
        f"INSERT INTO onward.signals (run_id, name, payload) VALUES ('{theirs}', 's', '{{}}')",
        f"UPDATE onward.runs SET tenant_id = 'globex' WHERE id = '{tenants.runs['acme']}'",
        "INSERT INTO onward.audit_heads (tenant_id, chain_seq, chain_mac, mac) "
        "VALUES ('globex', 0, 'c', 'm')",
    ]
    for statement in refused:
        with pytest.raises(sa.exc.ProgrammingError) as refusal, tenants.app.begin() as conn:
            conn.execute(sa.text("SELECT set_config('onward.tenant', 'acme', true)"))
            conn.execute(sa.text(statement))
        assert isinstance(refusal.value.orig, psycopg.errors.InsufficientPrivilege), statement
        assert "row-level security" in str(refusal.value.orig)


def test_the_ledger_as_onward_app_serves_one_tenant(tenants: Tenants,
                                                     settings: OnwardSettings) -> None:
    """Ledger reads, waits and token checks work as onward_app and are scoped by the
    database: another tenant's run, approval and audit rows do not exist for it."""
    acme, globex = tenants.ledger(settings, "acme"), tenants.ledger(settings, "globex")
    ours, theirs = tenants.runs["acme"], tenants.runs["globex"]
    assert [run.id for run in acme.list_runs()] == [ours]
    assert acme.get_run(theirs) is None
    assert {entry.run_id for entry in acme.audit() if entry.run_id} == {ours}
    assert [approval.run_id for approval in acme.approvals()] == [ours]
    with pytest.raises(UnknownApproval):
        acme.get_approval(globex.approvals()[0].id)
    assert [effect.run_id for effect in acme.effects(ours)]
    assert acme.verify_run(ours) == []  # its states are stored apart: every artifact read
    assert acme.wait(ours, timeout=10).status is RunStatus.COMPLETED
    with pytest.raises(UnknownRun):
        acme.wait(theirs, timeout=10)
    issued = globex.create_token(TokenRequest("gil", Role.VIEWER, "globex",
                                              ttl=timedelta(hours=1)))
    as_gil = Ledger(tenants.app, settings).authenticate(issued.secret)  # no tenant yet
    assert as_gil.actor.tenant_id == "globex"
    assert [run.id for run in as_gil.list_runs()] == [theirs]
    assert {token.tenant_id for token in acme.tokens()} == {"acme"}


def test_the_operator_role_sees_every_tenant(tenants: Tenants, database: str) -> None:
    """onward_operator, the explicit cross-tenant role of workers, dispatcher and reaper,
    sees every tenant's rows with no tenant set."""
    operator = sa.create_engine(as_role(database, OPERATOR))
    try:
        with tenants.owner.connect() as conn:
            every = {table: _count(conn, table) for table in PROTECTED}
        assert _counts_of(operator, None) == every
        assert all(every[table] > _owner_counts(tenants, "acme")[table]
                   for table in RECORDED if table != "artifacts")  # shared by content
    finally:
        operator.dispose()


def test_every_table_of_tenant_data_is_protected(database: str) -> None:
    """Catalog: every onward table but the fleet's, the counters and the version table has
    row-level security enabled and forced (a new table without it fails here), and the
    application's role owns nothing and cannot bypass it. A partition (of a table
    partitioned by time, migration 0038) is reached only through its parent, whose policies
    apply: neither role has any privilege on the partition itself."""
    with sa.create_engine(database).connect() as conn:
        tables = {row.relname: row for row in conn.execute(sa.text(
            "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, "
            "pg_get_userbyid(c.relowner) AS owner FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'onward' AND c.relkind IN ('r', 'p') "
            "AND NOT c.relispartition"))}
        partitions = conn.execute(sa.text(
            "SELECT c.relname, p.relname AS parent, "
            "has_table_privilege('onward_app', c.oid, "
            "  'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER') "
            "OR has_table_privilege('onward_operator', c.oid, "
            "  'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER') AS reachable "
            "FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid "
            "JOIN pg_class p ON p.oid = i.inhparent "
            "WHERE c.relnamespace = 'onward'::regnamespace AND c.relkind IN ('r', 'p')")).all()
        roles = {row.rolname: row for row in conn.execute(sa.text(
            "SELECT rolname, rolsuper, rolbypassrls FROM pg_roles "
            "WHERE rolname IN ('onward_app', 'onward_operator')"))}
    assert {row.parent for row in partitions} == {"step_attempts"}
    assert not [row.relname for row in partitions if row.reachable]
    unprotected = {name for name, row in tables.items()
                   if not (row.relrowsecurity and row.relforcerowsecurity)}
    assert unprotected == UNPROTECTED
    assert set(PROTECTED) <= set(tables)
    assert not {name for name, row in tables.items() if row.owner in (APP, OPERATOR)}
    assert set(roles) == {APP, OPERATOR}
    assert not any(row.rolsuper or row.rolbypassrls for row in roles.values())


def test_retention_as_onward_app_plans_no_artifact_it_cannot_delete(
        tenants: Tenants, settings: OnwardSettings) -> None:
    """A tenant's admin connected as onward_app compacts its own runs, but deletes no
    artifact (no policy lets that role: it cannot see another tenant's references; the
    reaper, as onward_operator, sweeps them). Its plan says so: it counts none, where it
    counted the artifacts its tenant shares with another (same states) as going. Nor does
    it try-lock an artifact: a lock held to its commit only made writers of it wait."""
    acme = tenants.ledger(settings.model_copy(update={"retention_policies": "*/*=0"}), "acme")
    with tenants.owner.connect() as conn:
        before = _count(conn, "artifacts")
    with sent_by(tenants.app) as sent:
        plan = acme.retention_plan()
        done = acme.retention_apply()

    assert any("onward.checkpoints" in s for s in sent)  # the spy saw the compaction
    assert [s for s in sent if "pg_try_advisory_xact_lock" in s] == []

    assert plan.runs == done.runs == 1
    with tenants.owner.connect() as conn:
        assert _count(conn, "artifacts") == before
    assert (done.artifacts, done.artifact_bytes) == (0, 0)
    assert (plan.artifacts, plan.artifact_bytes) == (0, 0)
    assert acme.verify_run(tenants.runs["acme"]) == []
