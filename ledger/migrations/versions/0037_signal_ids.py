"""a signal's MAC covers its row id: signals.mac re-signed

Revision ID: 0037
Revises: 0036

A signal's MAC (0035) covered its run, name and payload but not which row it is, so a copy
of a signed row verified too: a copy of a consumed signal could end a later wait for the
same name. The MAC now also covers the row id (ledger/signed.py ``signal``). Each existing
signal whose 0035 MAC verifies is signed again with its id; one that does not verify keeps
its MAC, which then fails as it did before (``onward verify`` reports it). Run it with the
``ONWARD_CHECKPOINT_KEY`` every onward process uses. The downgrade signs them without the id.
"""

from __future__ import annotations

import hmac
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0037'
down_revision = '0036'
branch_labels = None
depends_on = None

EXISTING = sa.text("SELECT id, run_id, name, payload, mac FROM onward.signals "
                   "WHERE mac IS NOT NULL ORDER BY id")
UPDATE = sa.text("UPDATE onward.signals SET mac = :mac WHERE id = :id")
BATCH = 5000


def _without_id(row: Any) -> dict[str, Any]:
    """The body 0035 signed."""
    return {"mac": "signal", "run_id": str(row["run_id"]), "name": row["name"],
            "payload": row["payload"]}


def _with_id(row: Any) -> dict[str, Any]:
    """The body signed from this revision on (ledger/signed.py ``signal``, kept here as it
    stands so that a later change there does not change what this migration did)."""
    return {**_without_id(row), "id": int(row["id"])}


def _resign(old: Any, new: Any) -> None:
    from ledger.migrate import migration_keys

    conn = op.get_bind()
    result = conn.execute(EXISTING).mappings()
    keys = None
    while rows := result.fetchmany(BATCH):
        keys = keys or migration_keys(conn)
        updates = []
        for row in rows:
            key_id, _, mac = str(row["mac"]).rpartition(":")
            if hmac.compare_digest(keys.mac(old(row), key_id or None), mac):
                updates.append({"id": row["id"], "mac": keys.sign(new(row))})
        if updates:
            conn.execute(UPDATE, updates)


def upgrade() -> None:
    _resign(_without_id, _with_id)


def downgrade() -> None:
    _resign(_with_id, _without_id)
