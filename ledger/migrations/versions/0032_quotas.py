"""quotas, priority and per-call retries (issue 13 item 5, docs/limits.md): runs.priority;
call_retries (the failures of one model or tool call a retry policy has counted);
limits, limit_grants and limit_waiters (fleet-wide concurrency and rate limits, FIFO per
limit with priority first), with the functions onward.limit_acquire and
onward.limit_release that take and give back a slot in one statement each

Revision ID: 0032
Revises: 0031
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0032'
down_revision = '0031'
branch_labels = None
depends_on = None

# Acquirers of one limit key go one at a time (the limit's row is locked for the statement's
# transaction); each statement of a PL/pgSQL function takes a new snapshot under READ
# COMMITTED, so the counts below see every grant committed by those that held the lock
# before. A grant counts against the concurrency until it is released or expires (its
# holder died: the expiry is the call's time limit and the lease margin, the time the
# holder's lease covers the call), and against the rate while it is within the window.
LIMIT_ACQUIRE = """
CREATE OR REPLACE FUNCTION onward.limit_acquire(
    p_key text, p_name text, p_concurrency integer, p_rate_count integer,
    p_rate_window_s float8, p_run uuid, p_seq integer, p_command text, p_epoch bigint,
    p_rank integer, p_hold_s float8, p_wait_s float8, p_grace_s float8)
RETURNS TABLE (granted boolean, retry_in_s float8, in_use integer, waiting integer)
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := onward.now();
    win interval := coalesce(p_rate_window_s, 0) * interval '1 second';
    used integer;
    recent integer;
    mine bigint;
    ahead integer;
    free integer;
    rate_free integer;
    frees_at timestamptz;
    wait float8;
BEGIN
    INSERT INTO onward.limits (key, name, concurrency, rate_count, rate_window_s)
    VALUES (p_key, p_name, p_concurrency, p_rate_count, p_rate_window_s)
    ON CONFLICT (key) DO NOTHING;
    PERFORM 1 FROM onward.limits l WHERE l.key = p_key FOR UPDATE;
    DELETE FROM onward.limit_grants g
     WHERE g.key = p_key AND (g.released_at IS NOT NULL OR g.expires_at <= t)
       AND g.granted_at <= t - win;
    DELETE FROM onward.limit_waiters w WHERE w.key = p_key AND w.expires_at <= t;
    SELECT count(*) FILTER (WHERE g.released_at IS NULL AND g.expires_at > t),
           count(*) FILTER (WHERE g.granted_at > t - win)
      INTO used, recent
      FROM onward.limit_grants g WHERE g.key = p_key;
    SELECT w.id INTO mine FROM onward.limit_waiters w WHERE w.key = p_key AND w.run_id = p_run;
    -- ahead of this call: waiters of a higher rank, and of the same rank that came first
    SELECT count(*) INTO ahead
      FROM onward.limit_waiters w JOIN onward.runs r ON r.id = w.run_id
     WHERE w.key = p_key AND w.run_id <> p_run AND r.status = 'running' AND r.seq = w.seq
       AND (w.rank > p_rank OR (w.rank = p_rank AND (mine IS NULL OR w.id < mine)));
    free := coalesce(p_concurrency - used, 2147483647);
    rate_free := coalesce(p_rate_count - recent, 2147483647);
    IF ahead < least(free, rate_free) THEN
        INSERT INTO onward.limit_grants (key, run_id, command_id, lease_epoch, granted_at,
                                         expires_at)
        VALUES (p_key, p_run, p_command, p_epoch, t, t + p_hold_s * interval '1 second');
        DELETE FROM onward.limit_waiters w WHERE w.key = p_key AND w.run_id = p_run;
        UPDATE onward.limits l
           SET granted = l.granted + 1, concurrency = p_concurrency, rate_count = p_rate_count,
               rate_window_s = p_rate_window_s, name = p_name
         WHERE l.key = p_key;
        RETURN QUERY SELECT true, 0.0::float8, used + 1, ahead;
        RETURN;
    END IF;
    wait := p_wait_s;
    IF ahead < free THEN
        -- the rate binds: the call may go when enough grants have left the window
        SELECT g.granted_at INTO frees_at FROM onward.limit_grants g
         WHERE g.key = p_key AND g.granted_at > t - win
         ORDER BY g.granted_at OFFSET greatest(ahead - rate_free, 0) LIMIT 1;
        IF frees_at IS NOT NULL THEN
            wait := least(p_wait_s, greatest(0.01, extract(epoch FROM frees_at + win - t)));
        END IF;
    END IF;
    INSERT INTO onward.limit_waiters (key, run_id, seq, rank, enqueued_at, expires_at)
    VALUES (p_key, p_run, p_seq, p_rank, t, t + (wait + p_grace_s) * interval '1 second')
    ON CONFLICT (key, run_id) DO UPDATE
       SET seq = EXCLUDED.seq, rank = EXCLUDED.rank, expires_at = EXCLUDED.expires_at;
    UPDATE onward.limits l
       SET throttled = l.throttled + 1, concurrency = p_concurrency, rate_count = p_rate_count,
           rate_window_s = p_rate_window_s, name = p_name
     WHERE l.key = p_key;
    RETURN QUERY SELECT false, wait, used, ahead + 1;
END $$
"""

# Give a grant back and wake the first waiters (priority first, then in order) for the
# slots now free: their delayed outbox rows become due at once, which NOTIFYs the
# dispatcher. A woken waiter that does not come back within p_grace_s stops holding its
# place for the others.
LIMIT_RELEASE = """
CREATE OR REPLACE FUNCTION onward.limit_release(
    p_key text, p_run uuid, p_command text, p_epoch bigint, p_grace_s float8)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := onward.now();
    free integer;
    woken integer;
BEGIN
    UPDATE onward.limit_grants g SET released_at = t
     WHERE g.key = p_key AND g.run_id = p_run AND g.command_id = p_command
       AND g.lease_epoch = p_epoch AND g.released_at IS NULL;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    SELECT l.concurrency - (SELECT count(*) FROM onward.limit_grants g
                             WHERE g.key = p_key AND g.released_at IS NULL
                               AND g.expires_at > t)
      INTO free FROM onward.limits l WHERE l.key = p_key;
    WITH heads AS (
        SELECT w.run_id, w.seq FROM onward.limit_waiters w
          JOIN onward.runs r ON r.id = w.run_id
         WHERE w.key = p_key AND w.expires_at > t AND r.status = 'running' AND r.seq = w.seq
         ORDER BY w.rank DESC, w.id
         LIMIT greatest(coalesce(free, 0), 0)
    ), woke AS (
        UPDATE onward.outbox o
           SET due_at = t, published_at = NULL, worker_publishes = false
          FROM heads h
         WHERE o.run_id = h.run_id AND o.seq = h.seq AND o.due_at > t
        RETURNING o.run_id
    ), kept AS (
        UPDATE onward.limit_waiters w SET expires_at = t + p_grace_s * interval '1 second'
          FROM woke WHERE w.key = p_key AND w.run_id = woke.run_id
    )
    SELECT count(*) INTO woken FROM woke;
    RETURN woken;
END $$
"""

PRIORITY_VALUES = "priority IN ('high', 'normal', 'low')"

OF_RUN = ("call_retries", "limit_grants", "limit_waiters")
"""Rows of a run, protected like migration 0028's (a tenant sees its runs' rows; the
operator role, which workers use, sees all). ``limits`` is the fleet's, like ``workers``."""


def _protect(table: str) -> None:
    op.execute(f"ALTER TABLE onward.{table} ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE onward.{table} FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant ON onward.{table} "
               f"USING (EXISTS (SELECT 1 FROM onward.runs r WHERE r.id = {table}.run_id)) "
               "WITH CHECK (onward.visible_run(run_id))")
    op.execute(f"CREATE POLICY operator ON onward.{table} TO onward_operator "
               "USING (true) WITH CHECK (true)")


def upgrade() -> None:
    op.add_column('runs', sa.Column('priority', sa.Text(), server_default=sa.text("'normal'"),
                                    nullable=False), schema='onward')
    op.create_check_constraint(op.f('ck_runs_priority'), 'runs', PRIORITY_VALUES,
                               schema='onward')
    op.create_table('call_retries',
    sa.Column('run_id', sa.UUID(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('command_id', sa.Text(), nullable=False),
    sa.Column('failures', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('last_error', sa.dialects.postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('onward.now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['onward.runs.id'], name=op.f('fk_call_retries_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'seq', 'command_id', name=op.f('pk_call_retries')),
    schema='onward'
    )
    op.create_table('limits',
    sa.Column('key', sa.Text(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('concurrency', sa.Integer(), nullable=True),
    sa.Column('rate_count', sa.Integer(), nullable=True),
    sa.Column('rate_window_s', sa.Float(precision=53), nullable=True),
    sa.Column('granted', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('throttled', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('declared_at', sa.DateTime(timezone=True), server_default=sa.text('onward.now()'), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_limits')),
    schema='onward'
    )
    op.create_table('limit_grants',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('key', sa.Text(), nullable=False),
    sa.Column('run_id', sa.UUID(), nullable=False),
    sa.Column('command_id', sa.Text(), nullable=False),
    sa.Column('lease_epoch', sa.BigInteger(), nullable=False),
    sa.Column('granted_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('released_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['key'], ['onward.limits.key'], name=op.f('fk_limit_grants_key_limits'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['onward.runs.id'], name=op.f('fk_limit_grants_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_limit_grants')),
    schema='onward'
    )
    op.create_index('ix_limit_grants_key_granted_at', 'limit_grants', ['key', 'granted_at'],
                    schema='onward')
    op.create_index('ix_limit_grants_run_id', 'limit_grants', ['run_id'], schema='onward')
    op.create_table('limit_waiters',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('key', sa.Text(), nullable=False),
    sa.Column('run_id', sa.UUID(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('rank', sa.SmallInteger(), nullable=False),
    sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['key'], ['onward.limits.key'], name=op.f('fk_limit_waiters_key_limits'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['onward.runs.id'], name=op.f('fk_limit_waiters_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_limit_waiters')),
    sa.UniqueConstraint('key', 'run_id', name=op.f('uq_limit_waiters_key_run_id')),
    schema='onward'
    )
    op.create_index('ix_limit_waiters_run_id', 'limit_waiters', ['run_id'], schema='onward')
    op.execute(LIMIT_ACQUIRE)
    op.execute(LIMIT_RELEASE)
    for table in OF_RUN:
        _protect(table)


def downgrade() -> None:
    for table in OF_RUN:
        op.execute(f"DROP POLICY IF EXISTS tenant ON onward.{table}")
        op.execute(f"DROP POLICY IF EXISTS operator ON onward.{table}")
    op.execute("DROP FUNCTION onward.limit_release(text, uuid, text, bigint, float8)")
    op.execute("DROP FUNCTION onward.limit_acquire(text, text, integer, integer, float8, uuid, "
               "integer, text, bigint, integer, float8, float8, float8)")
    op.drop_index('ix_limit_waiters_run_id', table_name='limit_waiters', schema='onward')
    op.drop_table('limit_waiters', schema='onward')
    op.drop_index('ix_limit_grants_run_id', table_name='limit_grants', schema='onward')
    op.drop_index('ix_limit_grants_key_granted_at', table_name='limit_grants', schema='onward')
    op.drop_table('limit_grants', schema='onward')
    op.drop_table('limits', schema='onward')
    op.drop_table('call_retries', schema='onward')
    op.drop_constraint(op.f('ck_runs_priority'), 'runs', type_='check', schema='onward')
    op.drop_column('runs', 'priority', schema='onward')
