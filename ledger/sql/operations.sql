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

-- name: effect_call_may_land
-- The effect's call that may land at the provider last (no person resolved the effect
-- since; docs/operating.md, "Resolve an effect by hand"): one never seen to end that its
-- worker marked in flight past its time limit first ('CallOverran': nothing bounds it),
-- then the one whose landing window closes last: ONWARD_CALL_LANDING_S (landing_s) past
-- the cover of a call never seen to end (covered_until; else its start plus the default
-- call time limit), and as long past the end of a call or repeat that ended with outcome
-- 'unknown' (its client gave up: a timeout, a dropped connection, a 5xx read as unknown,
-- an answer after its lease was lost), which may still be queued or processing there. A
-- lookup or poll sends nothing, so its own outcome opens no window, and a lookup that
-- found nothing ('missing') does not close one: it shows only that nothing had
-- landed when it looked. With the database's time.
SELECT c.attempt, c.kind, c.started_at, c.ended_at, c.outcome IS NULL AS open,
       coalesce(c.outcome IS NULL AND c.error->>'type' = 'CallOverran', false) AS overran,
       CASE WHEN c.outcome IS NULL
            THEN coalesce(c.covered_until,
                          c.started_at + %(default_cover_s)s * interval '1 second')
            ELSE c.ended_at
       END + %(landing_s)s * interval '1 second' AS lands_until,
       onward.now() AS now
  FROM onward.effect_attempts c
 WHERE c.effect_type = %(effect_type)s AND c.effect_id = %(effect_id)s
   AND (c.outcome IS NULL OR (c.kind IN ('call', 'repeat') AND c.outcome = 'unknown'))
   AND NOT EXISTS (SELECT 1 FROM onward.effect_attempts r
                    WHERE r.effect_type = c.effect_type AND r.effect_id = c.effect_id
                      AND r.attempt > c.attempt AND r.kind = 'resolve')
 ORDER BY overran DESC, lands_until DESC
 LIMIT 1
