"""tenants isolated by the database (issue 15 item 2): roles ``onward_app`` (the
application: owns nothing, no BYPASSRLS) and ``onward_operator`` (onward's own processes and
operators acting across tenants), privileges on every table for both, and row-level
security, forced, on every table holding tenant data, keyed on the transaction's
``onward.tenant`` setting: a transaction that sets no tenant sees no rows (docs/security.md)

Roles belong to the PostgreSQL cluster, not to the database: they are created only when
missing (several databases of one cluster may be migrated at once, so a concurrent creation
is not an error) and the downgrade leaves them.

Revision ID: 0027
Revises: 0026
"""

from __future__ import annotations

from alembic import op

revision = '0027'
down_revision = '0026'
branch_labels = None
depends_on = None

APP_ROLE = "onward_app"
OPERATOR_ROLE = "onward_operator"

TENANT = "NULLIF(current_setting('onward.tenant', true), '')"
"""The transaction's tenant; NULL when none is set (NULL equals nothing: fails closed)."""

OF_TENANT = f"tenant_id = {TENANT}"
OF_VISIBLE_RUN = "run_id IN (SELECT r.id FROM onward.runs r)"  # runs' own policy applies
OF_VISIBLE_EFFECT = ("(effect_type, effect_id) IN "
                     "(SELECT e.effect_type, e.effect_id FROM onward.effects e)")
WRITES_VISIBLE_RUN = "onward.visible_run(run_id)"
WRITES_VISIBLE_EFFECT = "onward.visible_effect(effect_type, effect_id)"
OF_VISIBLE_EVIDENCE = "sha256 IN (SELECT v.artifact_sha256 FROM onward.evidence v)"
TOKEN_PRESENTED = "token_hash = NULLIF(current_setting('onward.token_hash', true), '')"

VISIBLE_FUNCTIONS = """
CREATE FUNCTION onward.visible_run(wanted uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM onward.runs WHERE id = wanted);
END
$$;
CREATE FUNCTION onward.visible_effect(wanted_type text, wanted_id text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM onward.effects
                   WHERE effect_type = wanted_type AND effect_id = wanted_id);
END
$$;
"""
"""Whether the transaction's tenant sees a run (an effect), for the policies' write checks:
a statement that inserts a run and its first checkpoint together (``START_RUN``) needs the
run it has just inserted to count, which a subquery of the statement's own snapshot does
not see; a volatile PL/pgSQL function reads with a fresh command id, and is never inlined.
Row-level security applies inside (they are not SECURITY DEFINER)."""

TENANT_POLICIES: dict[str, str | tuple[str, str]] = {
    "runs": OF_TENANT,
    "approvals": OF_TENANT,
    "effects": OF_TENANT,
    "audit": OF_TENANT,
    "audit_heads": OF_TENANT,
    "corpora": OF_TENANT,
    "corpus_runs": OF_TENANT,
    # a token is readable by its own tenant, or by whoever presents its secret's hash (the
    # lookup that authenticates, before any tenant is known)
    "tokens": f"{OF_TENANT} OR {TOKEN_PRESENTED}",
    "checkpoints": (OF_VISIBLE_RUN, WRITES_VISIBLE_RUN),
    "step_attempts": (OF_VISIBLE_RUN, WRITES_VISIBLE_RUN),
    "evidence": (OF_VISIBLE_RUN, WRITES_VISIBLE_RUN),
    "signals": (OF_VISIBLE_RUN, WRITES_VISIBLE_RUN),
    "outbox": (OF_VISIBLE_RUN, WRITES_VISIBLE_RUN),
    "effect_attempts": (OF_VISIBLE_EFFECT, WRITES_VISIBLE_EFFECT),
}
"""Each table holding tenant data and who of a tenant may see and write its rows. Tables
without: ``workers``, ``worker_queues`` (the fleet), ``metric_totals`` (cross-tenant
counters), the version table; ``artifacts`` is below. A pair is (rows it reads, rows it
writes)."""

CREATE_ROLES = f"""
DO $$
DECLARE
    wanted text;
BEGIN
    FOREACH wanted IN ARRAY ARRAY['{APP_ROLE}', '{OPERATOR_ROLE}'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = wanted) THEN
            BEGIN
                EXECUTE 'CREATE ROLE ' || quote_ident(wanted)
                    || ' LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS';
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database of this cluster created it meanwhile
            END;
        END IF;
    END LOOP;
END
$$
"""

GRANTS = f"""
GRANT USAGE ON SCHEMA onward TO {APP_ROLE}, {OPERATOR_ROLE};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA onward
    TO {APP_ROLE}, {OPERATOR_ROLE};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA onward TO {APP_ROLE}, {OPERATOR_ROLE};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA onward TO {APP_ROLE}, {OPERATOR_ROLE};
ALTER DEFAULT PRIVILEGES IN SCHEMA onward
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {APP_ROLE}, {OPERATOR_ROLE};
ALTER DEFAULT PRIVILEGES IN SCHEMA onward
    GRANT USAGE, SELECT ON SEQUENCES TO {APP_ROLE}, {OPERATOR_ROLE};
"""

REVOKES = f"""
ALTER DEFAULT PRIVILEGES IN SCHEMA onward
    REVOKE SELECT, INSERT, UPDATE, DELETE ON TABLES FROM {APP_ROLE}, {OPERATOR_ROLE};
ALTER DEFAULT PRIVILEGES IN SCHEMA onward
    REVOKE USAGE, SELECT ON SEQUENCES FROM {APP_ROLE}, {OPERATOR_ROLE};
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA onward FROM {APP_ROLE}, {OPERATOR_ROLE};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA onward FROM {APP_ROLE}, {OPERATOR_ROLE};
REVOKE ALL ON ALL TABLES IN SCHEMA onward FROM {APP_ROLE}, {OPERATOR_ROLE};
REVOKE ALL ON SCHEMA onward FROM {APP_ROLE}, {OPERATOR_ROLE};
"""


def _protect(table: str, visible: str | tuple[str, str]) -> None:
    reads, writes = visible if isinstance(visible, tuple) else (visible, visible)
    op.execute(f"ALTER TABLE onward.{table} ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE onward.{table} FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant ON onward.{table} USING ({reads}) WITH CHECK ({writes})")
    op.execute(f"CREATE POLICY operator ON onward.{table} TO {OPERATOR_ROLE} "
               "USING (true) WITH CHECK (true)")


def upgrade() -> None:
    op.execute(CREATE_ROLES)
    op.execute(VISIBLE_FUNCTIONS)
    op.execute(GRANTS)
    for table, visible in TENANT_POLICIES.items():
        _protect(table, visible)
    # artifacts are content-addressed and shared: a tenant reads those its evidence names,
    # and anyone may add one (the bytes under their own hash); only the operator changes them
    op.execute("ALTER TABLE onward.artifacts ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE onward.artifacts FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant ON onward.artifacts FOR SELECT "
               f"USING ({OF_VISIBLE_EVIDENCE})")
    op.execute("CREATE POLICY tenant_add ON onward.artifacts FOR INSERT WITH CHECK (true)")
    op.execute(f"CREATE POLICY operator ON onward.artifacts TO {OPERATOR_ROLE} "
               "USING (true) WITH CHECK (true)")


def downgrade() -> None:
    for table in (*TENANT_POLICIES, "artifacts"):
        op.execute(f"DROP POLICY IF EXISTS tenant ON onward.{table}")
        op.execute(f"DROP POLICY IF EXISTS operator ON onward.{table}")
        op.execute(f"ALTER TABLE onward.{table} NO FORCE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE onward.{table} DISABLE ROW LEVEL SECURITY")
    op.execute("DROP POLICY IF EXISTS tenant_add ON onward.artifacts")
    op.execute(REVOKES)
    op.execute("DROP FUNCTION onward.visible_effect(text, text)")
    op.execute("DROP FUNCTION onward.visible_run(uuid)")
