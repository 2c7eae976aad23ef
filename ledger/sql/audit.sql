-- The audit log's hash chain (ledger/audit_chain.py).


-- name: unsealed_audit_rows
-- Committed audit rows not yet linked into their tenant's chain, in chain order.
SELECT id, tenant_id, at, mac FROM onward.audit WHERE chain_seq IS NULL
 ORDER BY tenant_id, id LIMIT %(limit)s

-- name: unsealed_audit_rows_of_tenant
-- One tenant's committed audit rows not yet linked into its chain, in chain order.
SELECT id, tenant_id, at, mac FROM onward.audit WHERE chain_seq IS NULL AND tenant_id = %(tenant)s
 ORDER BY id LIMIT %(limit)s

-- name: seal_audit_row
-- Link one audit row into its tenant's chain.
UPDATE onward.audit SET chain_seq = %(seq)s, chain_mac = %(link)s WHERE id = %(id)s AND chain_seq IS NULL

-- name: try_seal_lock
-- Take the sealer's advisory lock for this transaction, if no other sealer holds it.
SELECT pg_try_advisory_xact_lock(%(k)s)
