-- The ledger's schema revision (ledger/db.py): what processes check before and while they
-- work.

-- name: version_table
-- The version table Alembic keeps, if the database has one (NULL: never migrated).
SELECT to_regclass('onward.onward_alembic_version') AS found

-- name: stored_revision
-- The Alembic revision the database is at.
SELECT version_num FROM onward.onward_alembic_version

-- name: watch_client
-- A migration's session checks every second that its client is still there (PostgreSQL 14
-- and later; an older server has no such setting and is left as it is): an `onward db
-- upgrade` killed while its transaction waits for a lock (on a table a revision alters,
-- held by a long transaction) then ends at once, rolling back and releasing the migration
-- lock and the locks its revisions took, instead of waiting on, holding them, until
-- whatever blocked it ends.
SELECT CASE WHEN current_setting('server_version_num')::int >= 140000
            THEN set_config('client_connection_check_interval', '1000', false) END AS set

-- name: onward_schema
-- The onward schema, if the database has one (NULL: none; a scratch database must not).
SELECT to_regnamespace('onward') AS found

-- name: set_tenant
-- Row-level security keys every table of tenant data on onward.tenant (migration 0027): set
-- it for this transaction (local) or for the session of a connection that serves one
-- tenant only. A transaction that sets none sees no rows (docs/security.md).
SELECT set_config('onward.tenant', %(tenant)s, %(local)s)

-- name: latest_signed_heads
-- The 20 runs whose signed head changed last: a migration that signs existing rows first
-- checks its key against them (ledger/migrate.py migration_keys).
SELECT id, seq, head_hash, head_mac FROM onward.runs
 WHERE head_mac IS NOT NULL ORDER BY updated_at DESC LIMIT 20
