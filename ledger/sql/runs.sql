-- Starting runs (ledger/runs.py, ledger/client.py).


-- name: start_run
-- Insert the run, checkpoint 0 and its outbox row in one statement; nothing when the
-- idempotency key started a run already, or when the ledger is not at the revision of the
-- caller's code (an application's own transaction is checked here, in no extra statement:
-- the ledger's revision comes back beside the id).
WITH run AS (
    INSERT INTO onward.runs (id, tenant_id, workflow, conversation_id, idempotency_key, status,
                             max_attempts, head_hash, head_mac, budget_attempts, budget_tokens,
                             budget_cost_usd, deadline_at, trace_context, priority,
                             launch_mac)
    SELECT %(run_id)s, %(tenant_id)s, %(workflow)s, %(conversation_id)s, %(idempotency_key)s,
           %(status)s, %(max_attempts)s, %(hash)s, %(head_mac)s, %(budget_attempts)s,
           %(budget_tokens)s, %(budget_cost_usd)s,
           onward.now() + make_interval(secs => %(deadline_s)s::float8), %(trace_context)s,
           %(priority)s, %(launch_mac)s
     -- nothing is written on a ledger upgraded (or downgraded) under the caller's code
     WHERE EXISTS (SELECT 1 FROM onward.onward_alembic_version v
                    WHERE v.version_num = %(revision)s)
    ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
), checkpoint AS (
    INSERT INTO onward.checkpoints (run_id, seq, parent_hash, hash, key_id, envelope_version,
                                    step, next_step, outcome, state, workflow_version,
                                    workflow, lease_epoch)
    SELECT id, 0, NULL, %(hash)s, %(key_id)s, %(envelope_version)s, NULL, NULL, %(outcome)s,
           %(state)s, NULL, %(workflow)s, 0 FROM run
), queued AS (
    INSERT INTO onward.outbox (run_id, seq, trace_context) SELECT id, 0, %(trace_context)s FROM run
)
SELECT (SELECT id FROM run) AS id,
       (SELECT version_num FROM onward.onward_alembic_version) AS revision

-- name: existing_run
-- The run an idempotency key already started, with its input.
SELECT r.id, r.workflow, c.state FROM onward.runs r
JOIN onward.checkpoints c ON c.run_id = r.id AND c.seq = 0
WHERE r.tenant_id = %(tenant_id)s AND r.idempotency_key = %(idempotency_key)s
