"""a refused answer is signed: refused_answers.mac

Revision ID: 0042
Revises: 0041

``key_id:HMAC`` of a refusal (ledger/signed.py ``refused_answer``: its run, seq and call,
the answer's sha256 and size, the reason, the spend and the lease), written by the
statement that debits the answer and records the refusal (migration 0039). The retried step
that finds a standing refusal fails without calling only if it verifies, and ``onward
verify`` checks every one: an edited refusal, or one inserted in the database (which would
fail a step whose call was never refused), parks the run instead. Refusals that exist when
this migration runs are signed here, as they stand, with the checkpoint key every onward
process uses (run it with the same ``ONWARD_CHECKPOINT_KEY``; ``onward verify --all``
first). A deleted (or cleared) refusal is not detected: see docs/security.md.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0042'
down_revision = '0041'
branch_labels = None
depends_on = None

EXISTING = sa.text("SELECT * FROM onward.refused_answers ORDER BY id")


def _signed(row: Any) -> dict[str, Any]:
    """The body this revision signs (ledger/signed.py ``refused_answer``, kept here as it
    stands so that a later change there does not change what this migration did)."""
    names = ("seq", "command_id", "kind", "source", "request_hash", "answer_sha256",
             "answer_bytes", "reason", "input_tokens", "output_tokens", "lease_epoch")
    return {"mac": "refused_answer", "run_id": str(row["run_id"]),
            **{name: row[name] for name in names}, "cost_usd": f"{row['cost_usd']:f}"}


def upgrade() -> None:
    op.add_column('refused_answers', sa.Column('mac', sa.Text(), nullable=True),
                  schema='onward')
    from ledger.migrate import sign_existing

    sign_existing(op.get_bind(), EXISTING, "refused_answers", "mac",
                  lambda keys, row: keys.sign(_signed(row)))


def downgrade() -> None:
    op.drop_column('refused_answers', 'mac', schema='onward')
