-- Operator commands on one run (ledger/operations.py): continue, cancel, approve/reject,
-- effects resolve and repeat.

-- name: queue_step_at
-- (Re)write the outbox row that sends (run_id, seq) to the fleet, due at due_at (now if NULL).
INSERT INTO onward.outbox (run_id, seq, due_at)
VALUES (%(run_id)s, %(seq)s, coalesce(%(due_at)s, onward.now()))
ON CONFLICT (run_id, seq) DO UPDATE SET due_at = EXCLUDED.due_at,
                                        published_at = NULL, worker_publishes = false

-- name: unknown_effects
-- The run's effects whose outcome at the provider is unknown.
SELECT e.effect_type, e.effect_id, e.status FROM onward.effects e
 WHERE e.run_id = %(run_id)s AND e.status IN ('pending', 'accepted') AND {outcome_unknown}
 ORDER BY e.seq, e.created_at

-- name: effect_call_unknown
-- Whether a call of the effect may have reached the provider.
SELECT {unknown_call(e)} FROM onward.effects e
 WHERE e.effect_type = %(effect_type)s AND e.effect_id = %(effect_id)s
