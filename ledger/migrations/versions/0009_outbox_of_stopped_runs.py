"""a run that leaves 'running' takes its outbox rows with it, in the same transaction

Revision ID: 0009
Revises: 0008

Every path that moves a run out of ``running`` (commit of a finish, a failure or a wait,
a park, a cancel, a divergence, the reaper's deadline, expiry and timeout sweeps) fires
this trigger, so no outbox row survives a run that stopped (docs/design.md section 13,
invariant 3). Rows already left behind by earlier versions are deleted here.
"""

from __future__ import annotations

from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

DROP_OUTBOX_FUNCTION = """
CREATE OR REPLACE FUNCTION onward.drop_outbox_of_stopped_run() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM onward.outbox WHERE run_id = NEW.id;
    RETURN NULL;
END
$$
"""

DROP_OUTBOX_TRIGGER = """
CREATE TRIGGER runs_stopped_drop_outbox AFTER UPDATE OF status ON onward.runs
FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status <> 'running')
EXECUTE FUNCTION onward.drop_outbox_of_stopped_run()
"""


def upgrade() -> None:
    op.execute(DROP_OUTBOX_FUNCTION)
    op.execute(DROP_OUTBOX_TRIGGER)
    op.execute("DELETE FROM onward.outbox o USING onward.runs r "
               "WHERE o.run_id = r.id AND r.status <> 'running'")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS runs_stopped_drop_outbox ON onward.runs")
    op.execute("DROP FUNCTION IF EXISTS onward.drop_outbox_of_stopped_run()")
