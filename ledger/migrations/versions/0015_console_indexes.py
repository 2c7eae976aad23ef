"""console indexes: runs by tenant (and status, workflow) newest first, the approvals inbox,
the audit log by tenant

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

INDEXES = [
    ("ix_runs_tenant_id", "runs", ["tenant_id", "id"]),
    ("ix_runs_tenant_status_id", "runs", ["tenant_id", "status", "id"]),
    ("ix_runs_tenant_workflow_id", "runs", ["tenant_id", "workflow", "id"]),
    ("ix_approvals_tenant_status_created", "approvals",
     ["tenant_id", "status", "created_at", "id"]),
    ("ix_audit_tenant_id", "audit", ["tenant_id", "id"]),
]


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns, schema='onward')


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table, schema='onward')
