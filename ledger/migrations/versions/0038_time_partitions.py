"""step attempts partitioned by month (issue 15 item 5): ``step_attempts`` becomes a table
partitioned by range of ``started_at``, one partition per calendar month (UTC) named
``step_attempts_YYYY_MM`` and a default partition for rows of a month not created yet, so
that expiring a month of attempts is dropping a table (ledger/partitions.py).

PostgreSQL requires a partitioned table's primary key to include the partition key: the key
becomes ``(run_id, lease_epoch, started_at)``. ``(run_id, lease_epoch)`` stays unique
because the claim that inserts an attempt takes the next ``lease_epoch`` of the run under
the run row's lock (no statement inserts an attempt any other way, and none upserts one).

Two functions, owned by the migrations' role and run with its rights (SECURITY DEFINER),
let ``onward_operator`` (the reaper) manage partitions without owning the table:
``onward.ensure_partitions(parent, months_ahead)`` creates this month's and the next
months' partitions (moving rows the default partition holds for them) and
``onward.drop_partition(parent, partition)`` drops a month that has ended. Only
``onward_operator`` may call them. Partitions are reached only through their parent, whose
row-level security policies apply: the roles have no privilege on a partition itself.

Existing attempts are copied into the new table (a rewrite of the table: on a large ledger,
plan the upgrade's downtime); the policies are those of 0028.

Revision ID: 0038
Revises: 0037
"""

from __future__ import annotations

from alembic import op

revision = '0038'
down_revision = '0037'
branch_labels = None
depends_on = None

ROLES = "onward_app, onward_operator"
COLUMNS = ("run_id, lease_epoch, seq, attempt, step, worker, started_at, ended_at, outcome, "
           "error_type, error_message")

FUNCTIONS = r"""
CREATE FUNCTION onward.partition_key(parent text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE parent WHEN 'step_attempts' THEN 'started_at' END
$$;

CREATE FUNCTION onward.ensure_partitions(parent text, months_ahead integer)
RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' AS $$
DECLARE
    key text := onward.partition_key(parent);
    lo timestamptz;
    hi timestamptz;
    part text;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'onward.% is not partitioned by time', parent USING ERRCODE = '22023';
    END IF;
    IF months_ahead IS NULL OR months_ahead < 0 OR months_ahead > 120 THEN
        RAISE EXCEPTION 'months_ahead must be 0 to 120, not %', months_ahead
            USING ERRCODE = '22023';
    END IF;
    -- this month and the next ones, and any month the default partition holds rows of
    -- (written while its partition did not exist yet)
    FOR lo IN EXECUTE format(
        'SELECT date_trunc(''month'', onward.now()) + make_interval(months => g) '
        '  FROM generate_series(0, %s) g '
        'UNION SELECT DISTINCT date_trunc(''month'', %I) FROM onward.%I ORDER BY 1',
        months_ahead, key, parent || '_default')
    LOOP
        hi := lo + interval '1 month';
        part := parent || '_' || to_char(lo, 'YYYY_MM');
        CONTINUE WHEN to_regclass(format('onward.%I', part)) IS NOT NULL;
        EXECUTE format('CREATE TABLE onward.%I (LIKE onward.%I INCLUDING DEFAULTS '
                       'INCLUDING CONSTRAINTS)', part, parent);
        EXECUTE format('WITH moved AS (DELETE FROM onward.%I WHERE %I >= %L AND %I < %L '
                       'RETURNING *) INSERT INTO onward.%I SELECT * FROM moved',
                       parent || '_default', key, lo, key, hi, part);
        EXECUTE format('ALTER TABLE onward.%I ATTACH PARTITION onward.%I '
                       'FOR VALUES FROM (%L) TO (%L)', parent, part, lo, hi);
        EXECUTE format('REVOKE ALL ON onward.%I FROM PUBLIC, onward_app, onward_operator',
                       part);
        RETURN NEXT part;
    END LOOP;
END
$$;

CREATE FUNCTION onward.drop_partition(parent text, part text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' SET lock_timeout = '5s' AS $$
DECLARE
    bound text;
    hi timestamptz;
    dropped bigint;
BEGIN
    SELECT pg_get_expr(c.relpartbound, c.oid) INTO bound
      FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid
     WHERE c.relnamespace = 'onward'::regnamespace AND c.relname = part
       AND i.inhparent = to_regclass(format('onward.%I', parent));
    IF bound IS NULL OR onward.partition_key(parent) IS NULL THEN
        RAISE EXCEPTION 'onward.% is not a partition of onward.% by time', part, parent
            USING ERRCODE = '22023';
    END IF;
    hi := substring(bound FROM 'TO \(''([^'']+)''\)')::timestamptz;
    IF hi IS NULL OR hi > date_trunc('month', onward.now()) THEN
        RAISE EXCEPTION 'onward.% holds rows of this month or later (%): not dropped',
            part, bound USING ERRCODE = '22023';
    END IF;
    EXECUTE format('SELECT count(*) FROM onward.%I', part) INTO dropped;
    EXECUTE format('DROP TABLE onward.%I', part);
    RETURN dropped;
END
$$;

REVOKE ALL ON FUNCTION onward.ensure_partitions(text, integer) FROM PUBLIC, onward_app;
REVOKE ALL ON FUNCTION onward.drop_partition(text, text) FROM PUBLIC, onward_app;
GRANT EXECUTE ON FUNCTION onward.ensure_partitions(text, integer) TO onward_operator;
GRANT EXECUTE ON FUNCTION onward.drop_partition(text, text) TO onward_operator;
"""

TENANT_READS = "EXISTS (SELECT 1 FROM onward.runs r WHERE r.id = step_attempts.run_id)"
TENANT_WRITES = "onward.visible_run(run_id)"


def _policies() -> None:
    op.execute("ALTER TABLE onward.step_attempts ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE onward.step_attempts FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant ON onward.step_attempts USING ({TENANT_READS}) "
               f"WITH CHECK ({TENANT_WRITES})")
    op.execute("CREATE POLICY operator ON onward.step_attempts TO onward_operator "
               "USING (true) WITH CHECK (true)")
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON onward.step_attempts TO {ROLES}")


def _outcome_check() -> str:
    """The attempts' outcome check as the database has it (its list of outcomes)."""
    return str(op.get_bind().exec_driver_sql(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = 'onward.step_attempts'::regclass "
        "AND conname = 'ck_step_attempts_outcome'").scalar_one())


def _set_aside(suffix: str) -> None:
    """Rename step_attempts and its constraints and index out of the way."""
    op.execute(f"ALTER TABLE onward.step_attempts RENAME TO step_attempts_{suffix}")
    for old in ("pk_step_attempts", "fk_step_attempts_run_id_runs",
                "ck_step_attempts_outcome"):
        op.execute(f"ALTER TABLE onward.step_attempts_{suffix} "
                   f"RENAME CONSTRAINT {old} TO {old}_{suffix}")
    op.execute("ALTER INDEX onward.ix_step_attempts_worker_lost "
               f"RENAME TO ix_step_attempts_worker_lost_{suffix}")


def _create(check: str, key: str, partitioned: bool) -> None:
    op.execute(f"""
        CREATE TABLE onward.step_attempts (
            run_id uuid NOT NULL,
            lease_epoch bigint NOT NULL,
            seq integer NOT NULL,
            attempt integer NOT NULL,
            step text,
            worker text NOT NULL,
            started_at timestamptz NOT NULL DEFAULT onward.now(),
            ended_at timestamptz,
            outcome text,
            error_type text,
            error_message text,
            CONSTRAINT pk_step_attempts PRIMARY KEY ({key}),
            CONSTRAINT fk_step_attempts_run_id_runs FOREIGN KEY (run_id)
                REFERENCES onward.runs (id) ON DELETE CASCADE,
            CONSTRAINT ck_step_attempts_outcome {check}
        ){" PARTITION BY RANGE (started_at)" if partitioned else ""}""")
    op.execute("CREATE INDEX ix_step_attempts_worker_lost ON onward.step_attempts (run_id) "
               "WHERE outcome = 'worker_lost'")


def _copy(old: str) -> None:
    """Every row of ``old`` into the new table, then the new table's policies. The owner
    running this is subject to the forced policies unless it is a superuser or has
    BYPASSRLS, and would see no row of the old table: forcing is lifted on it first (its
    owner then reads it whole), and the copy is counted."""
    op.execute(f"ALTER TABLE onward.{old} NO FORCE ROW LEVEL SECURITY")
    op.execute(f"INSERT INTO onward.step_attempts ({COLUMNS}) "
               f"SELECT {COLUMNS} FROM onward.{old}")
    op.execute(f"""DO $$
        BEGIN
            IF (SELECT count(*) FROM onward.{old})
               <> (SELECT count(*) FROM onward.step_attempts) THEN
                RAISE EXCEPTION 'step_attempts: the copy from {old} is incomplete';
            END IF;
        END $$""")
    op.execute(f"DROP TABLE onward.{old}")
    _policies()


def upgrade() -> None:
    check = _outcome_check()
    _set_aside("unpartitioned")
    _create(check, "run_id, lease_epoch, started_at", partitioned=True)
    op.execute("CREATE TABLE onward.step_attempts_default PARTITION OF onward.step_attempts "
               "DEFAULT")
    op.execute(f"REVOKE ALL ON onward.step_attempts_default FROM PUBLIC, {ROLES}")
    op.execute(FUNCTIONS)
    _copy("step_attempts_unpartitioned")
    # the months the copied rows fell in (they sit in the default partition), this month
    # and the next three
    op.execute("SELECT onward.ensure_partitions('step_attempts', 3)")


def downgrade() -> None:
    check = _outcome_check()
    op.execute("DROP FUNCTION onward.drop_partition(text, text)")
    op.execute("DROP FUNCTION onward.ensure_partitions(text, integer)")
    op.execute("DROP FUNCTION onward.partition_key(text)")
    _set_aside("partitioned")
    _create(check, "run_id, lease_epoch", partitioned=False)
    _copy("step_attempts_partitioned")
