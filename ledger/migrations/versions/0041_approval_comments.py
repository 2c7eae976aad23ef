"""an approver's comment is signed with the decision: approvals.decision_mac re-signed

Revision ID: 0041
Revises: 0040

A decision's MAC (0022) covered the approval, the status, who and when, but not the
approver's comment: a comment edited in onward.approvals was shown to people as the
approver's. The MAC now also covers the comment's sha256 (ledger/signed.py
``approval_decision``, ``comment_sha256``). Each approved or rejected approval whose 0022
MAC verifies is signed again with its comment as it stands; one that does not verify keeps
its MAC, which then fails as before (``onward verify`` reports it). Run it with the
``ONWARD_CHECKPOINT_KEY`` every onward process uses (``onward verify --all`` first: a
comment edited before this runs is signed as it stands, as each decision's audit row shows
what the approver wrote). The downgrade signs them without the comment.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0041'
down_revision = '0040'
branch_labels = None
depends_on = None

DECIDED = sa.text("SELECT id, run_id, seq, action, artifact_hash, status, decided_by, "
                  "decided_at, comment, decision_mac FROM onward.approvals "
                  "WHERE status IN ('approved', 'rejected') AND decision_mac IS NOT NULL "
                  "ORDER BY id")
UPDATE = sa.text("UPDATE onward.approvals SET decision_mac = :mac WHERE id = :id")
BATCH = 5000


def _without_comment(row: Any) -> dict[str, Any]:
    """The body 0022 signed."""
    from ledger.signed import micros

    decided_at = row["decided_at"]
    return {"mac": "approval_decision", "id": str(row["id"]), "run_id": str(row["run_id"]),
            "seq": row["seq"], "action": row["action"], "artifact_hash": row["artifact_hash"],
            "status": str(row["status"]), "decided_by": row["decided_by"],
            "decided_at_us": micros(decided_at) if decided_at is not None else None}


def _with_comment(row: Any) -> dict[str, Any]:
    """The body signed from this revision on (ledger/signed.py ``approval_decision``, kept
    here as it stands; a comment in the database is never a bundle's dropped marker)."""
    comment = row["comment"]
    digest = hashlib.sha256(comment.encode()).hexdigest() if comment is not None else None
    return {**_without_comment(row), "comment_sha256": digest}


def _resign(old: Callable[[Any], dict[str, Any]], new: Callable[[Any], dict[str, Any]]) -> None:
    from ledger.migrate import migration_keys

    conn = op.get_bind()
    result = conn.execute(DECIDED).mappings()
    keys = None
    while rows := result.fetchmany(BATCH):
        keys = keys or migration_keys(conn)
        updates = []
        for row in rows:
            key_id, _, mac = str(row["decision_mac"]).rpartition(":")
            if hmac.compare_digest(keys.mac(old(row), key_id or None), mac):
                updates.append({"id": row["id"], "mac": keys.sign(new(row))})
        if updates:
            conn.execute(UPDATE, updates)


def upgrade() -> None:
    _resign(_without_comment, _with_comment)


def downgrade() -> None:
    _resign(_with_comment, _without_comment)
