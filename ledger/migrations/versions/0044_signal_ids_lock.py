"""an import's move of the signal id sequence excludes signal sends: onward.signal_ids_past

Revision ID: 0044
Revises: 0043

0043's ``onward.signal_ids_past(floor)`` took ``nextval`` then ``setval(floor)``: a signal
sent in between (its ``nextval`` landing there) took an id at or below the bundle's
largest, so the import was refused by name (and that bundle could never be imported here)
or, when the import inserted the id first, the signal send failed on a duplicate key. The
function now moves the sequence under the advisory lock ``onward.signal_ids`` taken
exclusively, for that moment only (a session lock, released before it returns: the import
goes on without it); a signal send takes the same lock shared, to its commit, in the
statement that takes its id (ledger/sql/waits.sql ``next_signal_id``). So the move waits
for the sends in flight to commit (an id they took is then found taken by name, as any id
given before the import), and a send that begins meanwhile waits for the move, then takes
an id above the bundle's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import op

revision = '0044'
down_revision = '0043'
branch_labels = None
depends_on = None

# The key is ledger/sql/waits.sql next_signal_id's: hashtextextended('onward.signal_ids', 0)
LOCKED = """
CREATE OR REPLACE FUNCTION onward.signal_ids_past(floor bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ids text := pg_get_serial_sequence('onward.signals', 'id');
    lock_key bigint := hashtextextended('onward.signal_ids', 0);
    next_id bigint;
BEGIN
    PERFORM pg_advisory_lock(lock_key);
    BEGIN
        next_id := nextval(ids);
        IF next_id <= floor THEN
            PERFORM setval(ids, floor);
            next_id := floor + 1;
        END IF;
        PERFORM pg_advisory_unlock(lock_key);
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        PERFORM pg_advisory_unlock(lock_key);
        RAISE;
    END;
    RETURN next_id;
END
$$;
"""


def _unlocked() -> str:
    """0043's function (and its grants), read from that revision's file as it stands."""
    spec = importlib.util.spec_from_file_location(
        "onward_migration_0043", Path(__file__).with_name("0043_signal_ids_on_import.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.FUNCTION)


def upgrade() -> None:
    op.execute(LOCKED)


def downgrade() -> None:
    op.execute("DROP FUNCTION onward.signal_ids_past(bigint)")
    op.execute(_unlocked())
