"""a person's decision on an approval is signed: approvals.decision_mac

Revision ID: 0022
Revises: 0021

``key_id:HMAC`` of the decision (ledger/signed.py ``approval_decision``), written where it is
taken; a step resumed by the decision runs only if it verifies. Decisions that exist when
this migration runs are signed here with the checkpoint key every onward process uses (run
it with the same ``ONWARD_CHECKPOINT_KEY``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None

DECIDED = sa.text("SELECT * FROM onward.approvals WHERE status IN ('approved', 'rejected')")


def upgrade() -> None:
    op.add_column('approvals', sa.Column('decision_mac', sa.Text(), nullable=True),
                  schema='onward')
    conn = op.get_bind()
    decided = conn.execute(DECIDED).mappings().all()
    if decided:
        _sign_existing(conn, decided)


def _sign_existing(conn: sa.Connection, decided: Sequence[sa.RowMapping]) -> None:
    from ledger.checkpoints import CheckpointKeys
    from ledger.settings import OnwardSettings

    keys = CheckpointKeys.from_settings(OnwardSettings())
    conn.execute(sa.text("UPDATE onward.approvals SET decision_mac = :mac WHERE id = :id"),
                 [{"mac": keys.sign(_decision(row)), "id": row["id"]} for row in decided])


def _decision(row: sa.RowMapping) -> dict[str, Any]:
    """The body this revision signed (0041 adds the comment's digest), kept here as it
    stands so that a later change of ledger/signed.py does not change what it did."""
    from ledger.signed import micros

    decided_at = row["decided_at"]
    return {"mac": "approval_decision", "id": str(row["id"]), "run_id": str(row["run_id"]),
            "seq": row["seq"], "action": row["action"], "artifact_hash": row["artifact_hash"],
            "status": str(row["status"]), "decided_by": row["decided_by"],
            "decided_at_us": micros(decided_at) if decided_at is not None else None}


def downgrade() -> None:
    op.drop_column('approvals', 'decision_mac', schema='onward')
