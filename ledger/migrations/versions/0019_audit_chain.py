"""the audit log is signed and chained: audit.mac, audit.chain_seq, audit.chain_mac,
audit_heads

Revision ID: 0019
Revises: 0018

Each audit row is signed by the transaction that writes it (``mac``); the reaper links
rows into their tenant's chain (``chain_seq``, ``chain_mac``) and signs the chain's head
(``audit_heads``): ledger/audit_chain.py. Rows that exist when this migration runs are
signed here with the checkpoint key every onward process uses (run it with the same
``ONWARD_CHECKPOINT_KEY``); the reaper seals them like any new row.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('audit', sa.Column('mac', sa.Text(), nullable=True), schema='onward')
    op.add_column('audit', sa.Column('chain_seq', sa.BigInteger(), nullable=True),
                  schema='onward')
    op.add_column('audit', sa.Column('chain_mac', sa.Text(), nullable=True), schema='onward')
    op.create_index('ix_audit_tenant_chain', 'audit', ['tenant_id', 'chain_seq'], unique=True,
                    schema='onward')
    op.create_index('ix_audit_unsealed', 'audit', ['tenant_id', 'id'], schema='onward',
                    postgresql_where=sa.text('chain_seq IS NULL'))
    op.create_table(
        'audit_heads',
        sa.Column('tenant_id', sa.Text(), nullable=False),
        sa.Column('chain_seq', sa.BigInteger(), nullable=False),
        sa.Column('chain_mac', sa.Text(), nullable=False),
        sa.Column('mac', sa.Text(), nullable=False),
        sa.Column('sealed_at', sa.DateTime(timezone=True),
                  server_default=sa.text('onward.now()'), nullable=False),
        sa.PrimaryKeyConstraint('tenant_id', name=op.f('pk_audit_heads')),
        schema='onward',
    )
    conn = op.get_bind()
    if conn.execute(sa.text("SELECT EXISTS (SELECT 1 FROM onward.audit)")).scalar():
        _sign_existing(conn)


def _sign_existing(conn: sa.Connection) -> None:
    from ledger import signed
    from ledger.checkpoints import CheckpointKeys
    from ledger.settings import OnwardSettings

    keys = CheckpointKeys.from_settings(OnwardSettings())
    rows = conn.execute(sa.text("SELECT * FROM onward.audit")).mappings().all()
    conn.execute(sa.text("UPDATE onward.audit SET mac = :mac WHERE id = :id"),
                 [{"mac": keys.sign(signed.audit_row(row)), "id": row["id"]} for row in rows])


def downgrade() -> None:
    op.drop_table('audit_heads', schema='onward')
    op.drop_index('ix_audit_unsealed', table_name='audit', schema='onward')
    op.drop_index('ix_audit_tenant_chain', table_name='audit', schema='onward')
    op.drop_column('audit', 'chain_mac', schema='onward')
    op.drop_column('audit', 'chain_seq', schema='onward')
    op.drop_column('audit', 'mac', schema='onward')
