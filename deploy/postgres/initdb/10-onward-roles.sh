#!/bin/sh
# The database roles onward connects as (docs/operating.md#database-roles-migration-0027), created once when the
# PostgreSQL container initialises its data directory (the image runs this as the superuser,
# from /docker-entrypoint-initdb.d; tests/acceptance/test_deploy_roles.py runs it against
# a cluster of its own):
#
#   onward_owner     owns the database and every table; `onward db upgrade` only. BYPASSRLS:
#                    a migration that rewrites existing rows (signs them, say) must see every
#                    tenant's, and the tables' row-level security is forced on their owner.
#   onward_app       the console, its HTTP API and the CLI: owns nothing, row-level security
#                    applies (it sees the tenant its transaction sets, nothing without one).
#   onward_operator  the workers, dispatchers, reapers and the metrics exporter: owns nothing,
#                    sees every tenant through an explicit policy per table.
#
# Passwords come from the environment (compose passes them from its own environment or
# .env): ONWARD_OWNER_DB_PASSWORD, ONWARD_APP_DB_PASSWORD, ONWARD_OPERATOR_DB_PASSWORD.
# Migration 0027 creates onward_app and onward_operator only when missing, so it keeps
# these (with their passwords) and needs no CREATEROLE. On a data directory initialised
# before this script existed, run it once by hand (docs/operating.md#database-roles).
set -eu

: "${ONWARD_OWNER_DB_PASSWORD:?the owner's password (onward db upgrade)}"
: "${ONWARD_APP_DB_PASSWORD:?onward_app's password (console, CLI)}"
: "${ONWARD_OPERATOR_DB_PASSWORD:?onward_operator's password (workers, dispatcher, reaper)}"
DATABASE="${POSTGRES_DB:-onward}"

psql -v ON_ERROR_STOP=1 --no-psqlrc --username "${POSTGRES_USER:-postgres}" --dbname "$DATABASE" \
     -v database="$DATABASE" \
     -v owner_password="$ONWARD_OWNER_DB_PASSWORD" \
     -v app_password="$ONWARD_APP_DB_PASSWORD" \
     -v operator_password="$ONWARD_OPERATOR_DB_PASSWORD" <<'SQL'
SET password_encryption = 'scram-sha-256';
CREATE ROLE onward_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE BYPASSRLS
    PASSWORD :'owner_password';
CREATE ROLE onward_app LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS
    PASSWORD :'app_password';
CREATE ROLE onward_operator LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS
    PASSWORD :'operator_password';
-- the owner creates the onward schema and its tables; nobody else may create anything
ALTER DATABASE :"database" OWNER TO onward_owner;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
REVOKE ALL ON DATABASE :"database" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"database" TO onward_app, onward_operator;
SQL
