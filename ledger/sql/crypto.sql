-- Tenants' data keys (ledger/crypto.py, migration 0036): wrapped by a master key, one active
-- per tenant, destroyed to erase what they sealed (docs/security.md).


-- name: tenant_key_active
-- The tenant's active data key, wrapped, and the master key that wraps it.
SELECT key_id, master_key_id, wrapped FROM onward.tenant_keys
 WHERE tenant_id = %(tenant)s AND state = 'active'

-- name: tenant_key_by_id
-- One data key by its id, whatever its state (a sealed value names the key it was sealed with).
SELECT tenant_id, key_id, state, master_key_id, wrapped
  FROM onward.tenant_keys WHERE key_id = %(key_id)s

-- name: tenant_keys_lock
-- Erasure's lock on the tenant's data keys, to its commit: it waits for an import or a first
-- key in flight, and they wait for it (tenant_keys_lock_shared), so an erasure can never
-- miss a key written beside it (docs/security.md, erasure).
SELECT pg_advisory_xact_lock(hashtextextended('onward.tenant_keys:' || %(tenant)s, 0))

-- name: tenant_keys_lock_shared
-- What adds data keys of the tenant (an import, a first key) holds to its commit, then
-- checks that the tenant was not erased (tenant_keys_destroyed): they do not wait for each
-- other, only for an erasure.
SELECT pg_advisory_xact_lock_shared(hashtextextended('onward.tenant_keys:' || %(tenant)s, 0))

-- name: tenant_keys_destroyed
-- How many of the tenant's data keys were destroyed (an erased tenant gets no new key).
SELECT count(*) FROM onward.tenant_keys
 WHERE tenant_id = %(tenant)s AND state = 'destroyed'

-- name: tenant_key_create
-- The tenant's first active data key; a concurrent creator's key wins (the partial unique
-- index on the active key), and the caller reads the active key again.
INSERT INTO onward.tenant_keys (tenant_id, key_id, state, master_key_id, wrapped)
VALUES (%(tenant)s, %(key_id)s, 'active', %(master)s, %(wrapped)s)
ON CONFLICT (tenant_id) WHERE state = 'active' DO NOTHING

-- name: tenant_keys_destroy
-- Destroy every data key of the tenant: the wrapped key is dropped, so what it sealed can no
-- longer be opened. The number of keys destroyed.
UPDATE onward.tenant_keys SET state = 'destroyed', wrapped = NULL, master_key_id = NULL,
       destroyed_at = onward.now()
 WHERE tenant_id = %(tenant)s AND state <> 'destroyed'
