-- The effect protocol (ledger/effects.py): exactly-once external writes, and whether the
-- provider may have acted on an effect.

-- fragment: unknown_call
-- A call of effect {alias} may have reached the provider: some call attempt (or an
-- operator's repeat) ended without a known outcome (its answer was lost, its worker died,
-- it is still in flight, or its late answer was fenced out; a repeat the provider only
-- accepted), and neither a LATER lookup by the effect's key said 'missing' nor a person
-- recorded what they found since (kind 'resolve', `onward effects resolve`). A stated
-- refusal ('failed': nothing happened this time) says nothing about an earlier call, and a
-- lookup by the effect's key says nothing about a repeat, which was sent under a key of its
-- own. A call that was still in flight past its time limit ('CallOverran', marked by its
-- worker) or answered after its lease was lost ('AnswerAfterLease') is cleared only by a
-- lookup that began after it ended: one made while it was in flight proves nothing.
-- An attempt that has not ended counts as a call whatever its kind says: its kind is signed
-- only as it ends, so an open call re-labelled a lookup in the database must still be
-- reconciled (a lookup or poll left open by a dead worker costs one more lookup).
EXISTS (SELECT 1 FROM onward.effect_attempts c
     WHERE c.effect_type = {alias}.effect_type AND c.effect_id = {alias}.effect_id
       AND ((c.kind IN ('call', 'repeat') AND c.outcome IN ('unknown', 'accepted'))
            OR c.outcome IS NULL)
       AND NOT EXISTS (
            SELECT 1 FROM onward.effect_attempts l
             WHERE l.effect_type = c.effect_type AND l.effect_id = c.effect_id
               AND l.attempt > c.attempt
               AND (l.kind = 'resolve'
                    OR (l.kind = 'lookup' AND l.outcome = 'missing' AND c.kind <> 'repeat'
                        AND (c.error->>'type' IS NULL OR c.error->>'type' NOT IN ('CallOverran', 'AnswerAfterLease')
                             OR l.started_at >= c.ended_at)))))

-- fragment: overran_call
-- A call of effect {alias} still in flight past its time limit: its worker marked it
-- ('CallOverran') and it has not ended, nor has a person resolved the effect since. While
-- it may still land, a lookup cannot tell whether it did (whatever kind an open attempt
-- says it is: see unknown_call).
EXISTS (SELECT 1 FROM onward.effect_attempts o
     WHERE o.effect_type = {alias}.effect_type AND o.effect_id = {alias}.effect_id
       AND o.outcome IS NULL AND o.error->>'type' = 'CallOverran'
       AND NOT EXISTS (SELECT 1 FROM onward.effect_attempts r
                        WHERE r.effect_type = o.effect_type AND r.effect_id = o.effect_id
                          AND r.attempt > o.attempt AND r.kind = 'resolve'))

-- fragment: outcome_unknown
-- The outcome at the provider of effect e is unknown: it was accepted, or it is pending
-- with a call that may have reached the provider. A pending effect with no attempt was
-- never sent. Such an effect is never closed by a refusal, a deadline or a cancel.
(e.status = 'accepted' OR (e.status = 'pending' AND {unknown_call(e)}))

-- fragment: never_landed
-- Effect e never reached the provider: pending, with no call that may have.
(e.status = 'pending' AND NOT {unknown_call(e)})

-- name: record_intent
-- Record the intent of an external write before the call (pending), or find the one
-- recorded already (an unsent one is reopened), fenced on the caller's live lease.
WITH lease AS (
    -- fenced: only the live holder of the step's lease may record or reopen an intent,
    -- and not once a cancel was requested
    SELECT EXISTS (SELECT 1 FROM onward.runs
                    WHERE id = %(run_id)s AND status = 'running'
                      AND (%(epoch)s::bigint IS NULL
                           OR (lease_epoch = %(epoch)s AND lease_expires_at > onward.now()
                               AND cancel_requested IS NULL))) AS held,
           EXISTS (SELECT 1 FROM onward.runs
                    WHERE id = %(run_id)s AND cancel_requested IS NOT NULL) AS cancelling
), ins AS (
    INSERT INTO onward.effects (effect_id, effect_type, run_id, tenant_id, seq, step,
                                command_id, tool_class, request_hash, recipient, payload,
                                status, intent_mac, recipient_mac)
    SELECT %(effect_id)s, %(effect_type)s, %(run_id)s, %(tenant_id)s, %(seq)s, %(step)s,
           %(command_id)s, %(tool_class)s, %(request_hash)s, %(recipient)s, %(payload)s,
           'pending', %(intent_mac)s, %(recipient_mac)s
     WHERE (SELECT held FROM lease)
    ON CONFLICT (effect_type, effect_id) DO NOTHING
    RETURNING *, true AS created
), reopened AS (
    -- closed 'unsent' when the run ended earlier, asked for again after a continue
    UPDATE onward.effects SET status = 'pending', completed_at = NULL, updated_at = onward.now()
     WHERE effect_type = %(effect_type)s AND effect_id = %(effect_id)s AND status = 'unsent'
       AND (SELECT held FROM lease)
    RETURNING *, false AS created
), found AS (
    SELECT * FROM ins
    UNION ALL
    SELECT * FROM reopened
    UNION ALL
    SELECT e.*, false AS created FROM onward.effects e
     WHERE e.effect_type = %(effect_type)s AND e.effect_id = %(effect_id)s
       AND NOT EXISTS (SELECT 1 FROM ins) AND NOT EXISTS (SELECT 1 FROM reopened)
)
SELECT lease.held, lease.cancelling, found.*,
       {unknown_call(found)} AS call_unknown, {overran_call(found)} AS call_overran
  FROM lease LEFT JOIN found ON true

-- name: begin_effect_attempt
-- Number and open the effect's next attempt (call, lookup, poll, repeat), fenced on the
-- caller's live lease, which it extends to cover the call.
WITH lease AS (
    -- fenced right before each provider call on the caller's live lease, which the same
    -- statement extends to cover the call's timeout: a call never outlives its lease.
    -- Once a cancel is requested no new call starts (lookups and polls still may).
    UPDATE onward.runs
       SET lease_expires_at = greatest(lease_expires_at,
                                       onward.now() + %(cover_s)s * interval '1 second')
     WHERE id = %(run_id)s AND lease_epoch = %(epoch)s AND status = 'running'
       AND lease_expires_at > onward.now()
       AND (%(kind)s <> 'call' OR cancel_requested IS NULL)
 RETURNING lease_expires_at
), bumped AS (
    -- the effect is still unresolved (epoch NULL: an operator's audited command)
    UPDATE onward.effects e SET attempts = e.attempts + 1, updated_at = onward.now()
     WHERE e.effect_type = %(effect_type)s AND e.effect_id = %(effect_id)s
       AND e.status IN ('pending', 'accepted')
       AND (%(epoch)s::bigint IS NULL OR EXISTS (SELECT 1 FROM lease))
 RETURNING e.attempts
), began AS (
    INSERT INTO onward.effect_attempts (effect_type, effect_id, attempt, kind, worker,
                                        lease_epoch, idempotency_key, covered_until)
    SELECT %(effect_type)s, %(effect_id)s, attempts, %(kind)s, %(worker)s, %(epoch)s, %(key)s,
           onward.now() + %(cover_s)s * interval '1 second'
      FROM bumped
    RETURNING attempt
)
SELECT (SELECT attempt FROM began) AS attempt,
       (SELECT lease_expires_at FROM lease) AS lease_expires_at,
       (SELECT cancel_requested IS NOT NULL FROM onward.runs WHERE id = %(run_id)s) AS cancelling

-- name: record_effect_outcome
-- Record an attempt's outcome and the effect's new status, fenced on the caller's lease;
-- the effect as it now is either way.
WITH fence AS (
    -- fenced on the caller's live lease: a stale holder's late answer never overwrites
    -- the current holder's record (epoch NULL: an operator's audited command)
    SELECT 1 FROM onward.runs
     WHERE id = %(run_id)s
       AND (%(epoch)s::bigint IS NULL
            OR (lease_epoch = %(epoch)s AND status = 'running'
                AND lease_expires_at > onward.now()))
), attempt AS (
    UPDATE onward.effect_attempts
       SET ended_at = onward.now(), outcome = %(outcome)s, provider_ref = %(provider_ref)s,
           error = %(attempt_error)s, mac = %(attempt_mac)s
     WHERE effect_type = %(effect_type)s AND effect_id = %(effect_id)s AND attempt = %(attempt)s
       AND EXISTS (SELECT 1 FROM fence)
), effect AS (
    UPDATE onward.effects
       SET status = %(status)s,
           provider_ref = coalesce(%(provider_ref)s, provider_ref),
           result = coalesce(%(result)s, result),
           error = %(error)s,
           reconciled = reconciled OR %(reconciled)s,
           polls = polls + %(poll)s,
           updated_at = onward.now(),
           completed_at = CASE WHEN %(status)s IN ('completed', 'failed') THEN onward.now() END,
           -- the outcome's MAC was computed from the values expected here; written only if
           -- they are the values written (else left unsigned, and verify says so)
           outcome_mac = CASE
               WHEN coalesce(%(provider_ref)s, provider_ref) IS NOT DISTINCT FROM %(final_ref)s
                AND coalesce(%(result)s::jsonb, result) IS NOT DISTINCT FROM %(final_result)s
               THEN %(outcome_mac)s END
     WHERE effect_type = %(effect_type)s AND effect_id = %(effect_id)s
       AND status IN ('pending', 'accepted') AND EXISTS (SELECT 1 FROM fence)
 RETURNING *
)
SELECT *, true AS fenced_in FROM effect
UNION ALL
SELECT e.*, EXISTS (SELECT 1 FROM fence) AS fenced_in FROM onward.effects e
 WHERE e.effect_type = %(effect_type)s AND e.effect_id = %(effect_id)s
   AND NOT EXISTS (SELECT 1 FROM effect)

-- name: mark_call_overran
-- The call's worker, while the call is still in flight past its time limit (a tool that
-- does not keep to its timeout): the next holder must not trust a lookup meanwhile.
UPDATE onward.effect_attempts SET error = %(error)s
 WHERE effect_type = %(effect_type)s AND effect_id = %(effect_id)s AND attempt = %(attempt)s
   AND lease_epoch = %(epoch)s AND outcome IS NULL
RETURNING attempt

-- name: record_late_answer
-- A call's answer that came after its lease was lost: the call has ended, its outcome is
-- unknown (the answer is not the effect's: the current holder reconciles by lookup).
-- Not fenced by the lease: it records only this worker's own attempt, never the effect.
UPDATE onward.effect_attempts
   SET ended_at = onward.now(), outcome = 'unknown', provider_ref = %(provider_ref)s,
       error = %(error)s, mac = %(attempt_mac)s
 WHERE effect_type = %(effect_type)s AND effect_id = %(effect_id)s AND attempt = %(attempt)s
   AND lease_epoch = %(epoch)s AND outcome IS NULL
RETURNING attempt

-- name: close_unsent_effects
-- A step about to commit, its retry having resolved what an earlier attempt left: close
-- its effects known never to have reached the provider, as failing the run closes them
-- (docs/effects.md, "When a run ends"): the step moves on without them. Fenced on the
-- caller's live lease; an unsent effect asked for again is reopened (record_intent).
UPDATE onward.effects e
   SET status = 'unsent', completed_at = onward.now(), updated_at = onward.now(),
       error = coalesce(e.error, '{}'::jsonb)
               || jsonb_build_object('closed_by', 'step committed without it')
 WHERE e.run_id = %(run_id)s AND e.seq = %(seq)s AND {never_landed}
   AND EXISTS (SELECT 1 FROM onward.runs
                WHERE id = %(run_id)s AND lease_epoch = %(epoch)s AND status = 'running'
                  AND lease_expires_at > onward.now())
RETURNING e.effect_id

-- name: unresolved_effects
-- The run's effects whose outcome at the provider is unknown.
SELECT e.*, {unknown_call(e)} AS call_unknown, {overran_call(e)} AS call_overran
  FROM onward.effects e
 WHERE e.run_id = %(run_id)s AND e.status IN ('pending', 'accepted') AND {outcome_unknown}
 ORDER BY e.seq, e.created_at

-- name: effect_attempts_checked
-- The effect's attempts in order, each with the effect's count of begun attempts and its
-- status and provider reference as of the same snapshot (one row with no attempt when
-- none was begun).
SELECT a.*, e.attempts AS begun, e.status AS effect_status,
       e.provider_ref AS effect_provider_ref
  FROM onward.effects e
  LEFT JOIN onward.effect_attempts a
         ON a.effect_type = e.effect_type AND a.effect_id = e.effect_id
 WHERE e.effect_type = %(effect_type)s AND e.effect_id = %(effect_id)s
 ORDER BY a.attempt
