"""tenant policies by probe (issue 15 item 2, after 0027): a run's rows are visible when a
probe of ``runs`` by primary key finds their run (0027's ``run_id IN (SELECT id FROM runs)``
hashed every run of the tenant for each statement); a tenant reads the artifacts its
evidence names (answers and request bodies) and those its checkpoints store their state in
(0027 let it read answers only, so a state stored apart could not be read as onward_app),
each test an index probe: ``ix_evidence_artifact_sha256``, ``ix_evidence_request_hash``,
``ix_checkpoints_state_artifact`` (partial: states stored apart only)

Revision ID: 0028
Revises: 0027
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0028'
down_revision = '0027'
branch_labels = None
depends_on = None

RUN_TABLES = ("checkpoints", "step_attempts", "evidence", "signals", "outbox")
WRITES_VISIBLE_RUN = "onward.visible_run(run_id)"
WRITES_VISIBLE_EFFECT = "onward.visible_effect(effect_type, effect_id)"

OLD_OF_RUN = "run_id IN (SELECT r.id FROM onward.runs r)"
OLD_OF_EFFECT = ("(effect_type, effect_id) IN "
                 "(SELECT e.effect_type, e.effect_id FROM onward.effects e)")
OLD_OF_ARTIFACT = "sha256 IN (SELECT v.artifact_sha256 FROM onward.evidence v)"

OF_EFFECT = ("EXISTS (SELECT 1 FROM onward.effects e "
             "WHERE e.effect_type = effect_attempts.effect_type "
             "AND e.effect_id = effect_attempts.effect_id)")
OF_ARTIFACT = (
    "EXISTS (SELECT 1 FROM onward.evidence v WHERE v.artifact_sha256 = artifacts.sha256) "
    "OR EXISTS (SELECT 1 FROM onward.evidence v WHERE v.request_hash = artifacts.sha256) "
    "OR EXISTS (SELECT 1 FROM onward.checkpoints c WHERE c.state ? '$artifact' "
    "AND (c.state -> '$artifact' ->> 'sha256') = artifacts.sha256)")
STATE_ARTIFACT = "((state -> '$artifact'::text) ->> 'sha256'::text)"


def _of_run(table: str) -> str:
    """The run is visible (the runs policy applies inside)."""
    return f"EXISTS (SELECT 1 FROM onward.runs r WHERE r.id = {table}.run_id)"


def _replace(table: str, reads: str, writes: str | None) -> None:
    op.execute(f"DROP POLICY tenant ON onward.{table}")
    if writes is None:
        op.execute(f"CREATE POLICY tenant ON onward.{table} FOR SELECT USING ({reads})")
    else:
        op.execute(f"CREATE POLICY tenant ON onward.{table} USING ({reads}) "
                   f"WITH CHECK ({writes})")


def upgrade() -> None:
    op.create_index('ix_evidence_artifact_sha256', 'evidence', ['artifact_sha256'],
                    schema='onward', postgresql_where=sa.text('artifact_sha256 IS NOT NULL'))
    op.create_index('ix_evidence_request_hash', 'evidence', ['request_hash'], schema='onward')
    op.create_index('ix_checkpoints_state_artifact', 'checkpoints', [sa.text(STATE_ARTIFACT)],
                    schema='onward', postgresql_where=sa.text("state ? '$artifact'::text"))
    for table in RUN_TABLES:
        _replace(table, _of_run(table), WRITES_VISIBLE_RUN)
    _replace("effect_attempts", OF_EFFECT, WRITES_VISIBLE_EFFECT)
    _replace("artifacts", OF_ARTIFACT, None)


def downgrade() -> None:
    _replace("artifacts", OLD_OF_ARTIFACT, None)
    _replace("effect_attempts", OLD_OF_EFFECT, WRITES_VISIBLE_EFFECT)
    for table in RUN_TABLES:
        _replace(table, OLD_OF_RUN, WRITES_VISIBLE_RUN)
    op.drop_index('ix_checkpoints_state_artifact', table_name='checkpoints', schema='onward')
    op.drop_index('ix_evidence_request_hash', table_name='evidence', schema='onward')
    op.drop_index('ix_evidence_artifact_sha256', table_name='evidence', schema='onward')
