"""recorded evidence and a run's result are signed: evidence.mac, runs.result_mac

Revision ID: 0016
Revises: 0015

Both are ``key_id:HMAC`` (ledger/signed.py ``evidence`` and ``result``). Rows that exist
when this migration runs are signed here with the checkpoint key every onward process uses
(run it with the same ``ONWARD_CHECKPOINT_KEY``); evidence whose artifact is missing or does
not match its sha256 is left unsigned, so `onward verify` reports it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

EVIDENCE = sa.text("""
SELECT e.*, a.body AS artifact_body FROM onward.evidence e
  LEFT JOIN onward.artifacts a ON a.sha256 = e.artifact_sha256
""")
RESULTS = sa.text("SELECT id, seq, result FROM onward.runs WHERE result IS NOT NULL")


def upgrade() -> None:
    op.add_column('evidence', sa.Column('mac', sa.Text(), nullable=True), schema='onward')
    op.add_column('runs', sa.Column('result_mac', sa.Text(), nullable=True), schema='onward')
    conn = op.get_bind()
    if conn.execute(sa.text("SELECT EXISTS (SELECT 1 FROM onward.runs)")).scalar():
        _sign_existing(conn)


def _sign_existing(conn: sa.Connection) -> None:
    from ledger import signed
    from ledger.checkpoints import CheckpointKeys, canonical_json, sha256_hex
    from ledger.settings import OnwardSettings

    keys = CheckpointKeys.from_settings(OnwardSettings())
    for row in conn.execute(EVIDENCE).mappings().all():
        if row["artifact_sha256"] is None:
            digest = sha256_hex(canonical_json(row["response"]))
        elif row["artifact_body"] is not None and \
                sha256_hex(bytes(row["artifact_body"])) == row["artifact_sha256"]:
            digest = row["artifact_sha256"]
        else:
            continue
        conn.execute(sa.text("UPDATE onward.evidence SET mac = :mac "
                             "WHERE run_id = :run AND command_id = :command"),
                     {"mac": keys.sign(signed.evidence(row["run_id"], row, digest)),
                      "run": row["run_id"], "command": row["command_id"]})
    for run in conn.execute(RESULTS).mappings().all():
        conn.execute(sa.text("UPDATE onward.runs SET result_mac = :mac WHERE id = :id"),
                     {"mac": keys.sign(signed.result(run["id"], run["seq"], run["result"])),
                      "id": run["id"]})


def downgrade() -> None:
    op.drop_column('runs', 'result_mac', schema='onward')
    op.drop_column('evidence', 'mac', schema='onward')
