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

-- name: effect_call_in_flight
-- The effect's attempt never seen to end (no person resolved the effect since) that may
-- land last: one its worker marked in flight past its time limit first ('CallOverran':
-- nothing bounds it), then the one whose cover (covered_until; else its start plus the
-- default call time limit) ran out last; with the database's time.
SELECT c.attempt, c.started_at,
       coalesce(c.error->>'type' = 'CallOverran', false) AS overran,
       coalesce(c.covered_until,
                c.started_at + %(default_cover_s)s * interval '1 second') AS covered_until,
       onward.now() AS now
  FROM onward.effect_attempts c
 WHERE c.effect_type = %(effect_type)s AND c.effect_id = %(effect_id)s
   AND c.outcome IS NULL
   AND NOT EXISTS (SELECT 1 FROM onward.effect_attempts r
                    WHERE r.effect_type = c.effect_type AND r.effect_id = c.effect_id
                      AND r.attempt > c.attempt AND r.kind = 'resolve')
 ORDER BY overran DESC, 4 DESC
 LIMIT 1
