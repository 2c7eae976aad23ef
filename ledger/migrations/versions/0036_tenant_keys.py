"""per-tenant data keys, wrapped by a master key: tenant_keys

Revision ID: 0036
Revises: 0035

Each tenant's values marked sensitive (states' sensitive fields, effect payloads and
results, recorded model answers, approval artifacts) are sealed with AES-GCM under a data
key of that tenant (ledger/crypto.py). The data key is kept here only wrapped (AES-GCM) by a
master key that never lives in the database (``ONWARD_ENCRYPTION_KEYS``). Erasing a tenant
clears its wrapped keys (``wrapped`` NULL, ``state`` destroyed): its sealed values can no
longer be read, while every MAC and chain, which cover a digest and not the ciphertext,
still verifies. Row-level security as for the other tenant tables (0027).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0036'
down_revision = '0035'
branch_labels = None
depends_on = None

OF_TENANT = "tenant_id = NULLIF(current_setting('onward.tenant', true), '')"


def upgrade() -> None:
    op.create_table(
        'tenant_keys',
        sa.Column('tenant_id', sa.Text(), nullable=False),
        sa.Column('key_id', sa.Text(), nullable=False),
        sa.Column('state', sa.Text(), nullable=False),
        sa.Column('master_key_id', sa.Text(), nullable=True),
        sa.Column('wrapped', postgresql.BYTEA(), nullable=True),
        sa.Column('created_at', postgresql.TIMESTAMP(timezone=True), nullable=False,
                  server_default=sa.text('onward.now()')),
        sa.Column('destroyed_at', postgresql.TIMESTAMP(timezone=True), nullable=True),
        sa.CheckConstraint("state IN ('active', 'retired', 'destroyed')",
                           name=op.f('ck_tenant_keys_state')),
        sa.CheckConstraint("(state = 'destroyed') = (wrapped IS NULL)",
                           name=op.f('ck_tenant_keys_wrapped')),
        sa.PrimaryKeyConstraint('key_id', name=op.f('pk_tenant_keys')),
        schema='onward',
    )
    op.create_index('ix_tenant_keys_active', 'tenant_keys', ['tenant_id'], unique=True,
                    schema='onward', postgresql_where=sa.text("state = 'active'"))
    op.create_index('ix_tenant_keys_tenant_id', 'tenant_keys', ['tenant_id'],
                    schema='onward')
    op.execute("ALTER TABLE onward.tenant_keys ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE onward.tenant_keys FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant ON onward.tenant_keys USING ({OF_TENANT}) "
               f"WITH CHECK ({OF_TENANT})")
    op.execute("CREATE POLICY operator ON onward.tenant_keys TO onward_operator "
               "USING (true) WITH CHECK (true)")


def downgrade() -> None:
    op.drop_table('tenant_keys', schema='onward')
