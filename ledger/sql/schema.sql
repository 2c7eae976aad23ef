-- The ledger's schema revision (ledger/db.py): what processes check before and while they
-- work.

-- name: version_table
-- The version table Alembic keeps, if the database has one (NULL: never migrated).
SELECT to_regclass('onward.onward_alembic_version') AS found

-- name: stored_revision
-- The Alembic revision the database is at.
SELECT version_num FROM onward.onward_alembic_version

-- name: onward_schema
-- The onward schema, if the database has one (NULL: none; a scratch database must not).
SELECT to_regnamespace('onward') AS found
