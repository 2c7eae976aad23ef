-- Corpora and bundles (ledger/corpus_bundle.py).


-- name: corpus_import_lock
-- One import of a tenant's bundles at a time, held to its commit: a second import of the same
-- runs waits, then finds them present (skipped: same head) instead of failing on their keys.
-- Imports of different tenants do not wait for each other (a signal id both bundles hold is
-- refused by name: the second to insert it finds it taken).
SELECT pg_advisory_xact_lock(hashtextextended('onward.corpus_import:' || %(tenant)s, 0))
