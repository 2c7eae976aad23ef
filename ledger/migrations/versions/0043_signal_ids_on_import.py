"""a corpus import keeps its signals' ids: onward.signal_ids_past(floor)

Revision ID: 0043
Revises: 0042

A signal's MAC covers its row id (migration 0037), and each checkpoint names the signals it
consumed by id (refs.signals): a bundle's signals must keep their ids where they are
imported, or every imported run with a signal fails to verify. Loading a bundle moves the
signals' id sequence past the bundle's largest id first, then inserts the signals with their
own ids (ledger/corpus_bundle.py), so a signal sent meanwhile takes an id above them. The
application's roles may read the sequence but not set it: this function, run with the
owner's rights (SECURITY DEFINER), only ever moves it forward.
"""

from __future__ import annotations

from alembic import op

revision = '0043'
down_revision = '0042'
branch_labels = None
depends_on = None

FUNCTION = """
CREATE FUNCTION onward.signal_ids_past(floor bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ids text := pg_get_serial_sequence('onward.signals', 'id');
    next_id bigint := nextval(ids);
BEGIN
    IF next_id <= floor THEN
        PERFORM setval(ids, floor);
        RETURN floor + 1;
    END IF;
    RETURN next_id;
END
$$;
REVOKE ALL ON FUNCTION onward.signal_ids_past(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION onward.signal_ids_past(bigint) TO onward_app, onward_operator;
"""


def upgrade() -> None:
    op.execute(FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION onward.signal_ids_past(bigint)")
