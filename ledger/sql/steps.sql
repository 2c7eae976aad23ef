-- The step hot path (ledger/steps.py): claim, commit, fail, park, release. Each statement
-- is one transaction on an autocommit connection, built from data-modifying CTEs.

-- fragment: close_attempt
-- The step's attempt row (written by its claim) ends in the statement that ends the lease,
-- once the CTE {alias} changed the run: with the attempt's outcome, its step and its error
-- (NULL where there is none). claimed_at is the claim's onward.now(), which its attempt row
-- took as started_at, the partition key (migration 0038): naming it prunes the update to the
-- attempt's month instead of probing every partition.
attempt AS (
    UPDATE onward.step_attempts
       SET ended_at = onward.now(), outcome = %(attempt_outcome)s, step = %(step)s,
           error_type = %(error_type)s, error_message = %(error_message)s
     WHERE run_id = %(run_id)s AND lease_epoch = %(epoch)s
       AND started_at = %(claimed_at)s::timestamptz AND EXISTS (SELECT 1 FROM {alias})
)

-- name: claim
-- Take the lease of run_id at seq (docs/design.md section 4.1), consume its outbox row,
-- end the attempt a lost holder left open, open this one, and read the checkpoint to
-- restore from with its parent's hash, how long the lease lasts (lease_s), whether an
-- answer is recorded or refused at this seq (answered) and whether an effect at this seq is
-- left unsettled (effects_open).
WITH claimed AS (
    UPDATE onward.runs
       SET lease_owner = %(owner)s,
           lease_epoch = lease_epoch + 1,
           -- a step with a timeout is leased for it and a margin at least (docs/steps.md)
           lease_expires_at = onward.now() + greatest(
               %(ttl)s, coalesce((%(leases)s::jsonb -> workflow ->> coalesce(step, ''))::float8,
                                 0)) * interval '1 second',
           attempt = attempt + 1,
           attempts_total = attempts_total + 1,
           -- an expired lease still set means its holder never finished: a restore
           restore_count = restore_count + (lease_expires_at IS NOT NULL)::int,
           -- a run not yet bound to a version binds to the code that first claims it, so
           -- a retry of a step that acted is routed to that code (docs/versioning.md)
           workflow_version = coalesce(workflow_version,
                                       (%(bind)s::jsonb -> workflow ->> 0)::int),
           state_schema_version = CASE WHEN workflow_version IS NULL
                                       THEN (%(bind)s::jsonb -> workflow ->> 1)::int
                                       ELSE state_schema_version END,
           updated_at = onward.now()
     WHERE id = %(run_id)s AND seq = %(seq)s AND status = 'running'
       AND (lease_expires_at IS NULL OR lease_expires_at < onward.now())
       AND attempt < max_attempts
       -- a duplicate message must not cut a retry's backoff or a timer short
       AND NOT EXISTS (SELECT 1 FROM onward.outbox o
                        WHERE o.run_id = %(run_id)s AND o.seq = %(seq)s
                          AND o.due_at > onward.now())
       -- no code runs a step on a ledger upgraded (or downgraded) under it
       AND EXISTS (SELECT 1 FROM onward.onward_alembic_version v
                    WHERE v.version_num = %(revision)s)
 RETURNING id, tenant_id, workflow, workflow_version, seq, step, lease_epoch, attempt,
           max_attempts, head_hash, head_mac, attempts_total, budget_attempts, budget_tokens,
           budget_cost_usd, deadline_at, used_tokens, used_cost_usd, created_at,
           state_schema_version, mode, parent_run_id, parent_seq, allow_irreversible,
           launch_mac, handbacks, cancel_requested, priority,
           onward.now() AS claimed_at,
           extract(epoch FROM lease_expires_at - onward.now())::float8 AS lease_s
), consumed AS (
    DELETE FROM onward.outbox o USING claimed c WHERE o.run_id = c.id AND o.seq = c.seq
), lost AS (
    UPDATE onward.step_attempts a SET outcome = 'worker_lost', ended_at = onward.now()
      FROM claimed c
     WHERE a.run_id = c.id AND a.lease_epoch = c.lease_epoch - 1 AND a.outcome IS NULL
), recorded AS (
    INSERT INTO onward.step_attempts (run_id, lease_epoch, seq, attempt, step, worker)
    SELECT id, lease_epoch, seq, attempt, step, %(owner)s FROM claimed
)
SELECT c.*, cp.hash AS cp_hash, cp.parent_hash AS cp_parent_hash, cp.key_id AS cp_key_id,
       cp.step AS cp_step, cp.next_step AS cp_next_step, cp.outcome AS cp_outcome,
       cp.state AS cp_state, cp.workflow_version AS cp_workflow_version,
       cp.control AS cp_control, cp.state_schema_version AS cp_state_schema_version,
       cp.refs AS cp_refs, cp.workflow AS cp_workflow, cp.envelope_version AS cp_envelope_version,
       cp.snapshot_seq AS cp_snapshot_seq, cp.chain_bytes AS cp_chain_bytes,
       base.state AS chain_base, chain.deltas AS chain_deltas, chain.seqs AS chain_seqs,
       art.body AS state_artifact,
       parent.hash AS parent_found_hash,
       -- an answer an earlier attempt recorded (or had refused) at this seq: with none, the
       -- step's first model call or read needs no look-up (tasks/evidence_calls.py)
       (EXISTS (SELECT 1 FROM onward.evidence e WHERE e.run_id = c.id AND e.seq = c.seq)
        OR EXISTS (SELECT 1 FROM onward.refused_answers x
                    WHERE x.run_id = c.id AND x.seq = c.seq AND x.cleared_at IS NULL))
           AS answered,
       -- an effect an earlier execution of this seq left pending or accepted: a step that
       -- deferred (to poll a job, for a limit's slot, to retry a call) or was continued
       -- after a park is claimed as attempt 1 again, so with this set it resolves the run's
       -- unknown effects before it commits, as a retry does (tasks/executor.py)
       EXISTS (SELECT 1 FROM onward.effects e
                WHERE e.run_id = c.id AND e.seq = c.seq AND e.status IN ('pending', 'accepted'))
           AS effects_open
  FROM claimed c
  LEFT JOIN onward.checkpoints cp ON cp.run_id = c.id AND cp.seq = c.seq
  LEFT JOIN onward.checkpoints parent ON parent.run_id = c.id AND parent.seq = c.seq - 1
  -- a delta's chain: its snapshot and the deltas after it (ledger/states.py)
  LEFT JOIN onward.checkpoints base ON base.run_id = c.id AND base.seq = cp.snapshot_seq
  LEFT JOIN LATERAL (
      SELECT jsonb_agg(d.state_delta ORDER BY d.seq) AS deltas,
             array_agg(d.seq ORDER BY d.seq) AS seqs
        FROM onward.checkpoints d
       WHERE cp.snapshot_seq IS NOT NULL AND d.run_id = c.id
         AND d.seq > cp.snapshot_seq AND d.seq <= c.seq
  ) chain ON true
  -- a state stored apart (the head's, or its chain's snapshot's)
  LEFT JOIN onward.artifacts art
    ON art.sha256 = coalesce(base.state, cp.state) -> '$artifact' ->> 'sha256'

-- name: count_stale
-- A refused claim: count the stale delivery on the run and read why it was refused.
UPDATE onward.runs SET stale_deliveries = stale_deliveries + 1
 WHERE id = %(run_id)s
RETURNING seq, status, attempt, max_attempts, workflow, workflow_version,
          (lease_expires_at IS NOT NULL AND lease_expires_at >= onward.now()) AS leased,
          EXISTS (SELECT 1 FROM onward.outbox o
                   WHERE o.run_id = %(run_id)s AND o.seq = runs.seq
                     AND o.due_at > onward.now()) AS not_due,
          (SELECT version_num FROM onward.onward_alembic_version) AS revision

-- name: commit
-- Advance the run to seq + 1: its checkpoint, its next outbox row, an approval it waits
-- for, a large state's artifact and the attempt's end, in one transaction.
-- A signal wait consumes a signal sent before the wait began in this same statement (so no
-- crash can fall between the two): the run then stays running, with its next outbox row.
-- Nothing else consumes a signal of a run that is running (Ledger.signal and the reaper
-- wake waiting runs only), so the signal is read without a lock and updated after the run
-- row: locks go run first, then signal, everywhere. A signal committed while this statement
-- runs is not in its snapshot; the reaper wakes the run then (ledger/waits.py). Model and
-- read spend is not debited here: recording each answer debited it (ledger/evidence.py),
-- so a step that never commits has spent it all the same.
-- With chain_owner (eager continuation, workers/runtime.py), a commit that leaves the run
-- running with its next step due now also claims that step for chain_owner, in this same
-- statement: lease, epoch, attempt and the attempt row are what the claim statement would
-- write, and no outbox row is written (the lease stands for it). So an eager step costs one
-- transaction, not two. A worker that dies before running the step it claimed this way
-- leaves an expiring lease, which the reaper restores like any lost holder's (section 7).
-- Like the claim statement, a chained commit returns how long that lease lasts (lease_s),
-- so the claimed step's first model call or read needs no look-up either
-- (tasks/evidence_calls.py). Unlike it, it reads no evidence: nothing can be recorded or
-- refused at seq + 1 before this statement moves the run there (ledger/steps.py,
-- StepStore._successor_claim, says why).
WITH chain AS (
    SELECT %(chain_owner)s::text IS NOT NULL AND %(status)s = 'running'
           AND %(due_at)s::timestamptz IS NULL AND %(next_max_attempts)s > 0
           -- no code runs a step on a ledger upgraded (or downgraded) under it
           AND EXISTS (SELECT 1 FROM onward.onward_alembic_version v
                        WHERE v.version_num = %(revision)s) AS go
), early_signal AS (
    SELECT id FROM onward.signals
     WHERE %(signal)s::text IS NOT NULL AND run_id = %(run_id)s AND name = %(signal)s
       AND consumed_seq IS NULL
     ORDER BY id LIMIT 1
), advanced AS (
    UPDATE onward.runs
       SET seq = seq + 1, step = %(next_step)s,
           status = CASE WHEN EXISTS (SELECT 1 FROM early_signal) THEN 'running'
                         ELSE %(status)s END,
           max_attempts = %(next_max_attempts)s, workflow_version = %(workflow_version)s,
           lease_owner = CASE WHEN chain.go THEN %(chain_owner)s END,
           lease_expires_at = CASE WHEN chain.go
                                   THEN onward.now() + %(chain_ttl)s * interval '1 second' END,
           lease_epoch = lease_epoch + chain.go::int, attempt = chain.go::int,
           attempts_total = attempts_total + chain.go::int,
           head_hash = %(hash)s,
           head_mac = %(head_mac)s,
           result = %(result)s, result_mac = %(result_mac)s, last_error = NULL,
           waiting_on = CASE WHEN EXISTS (SELECT 1 FROM early_signal) THEN NULL
                             ELSE %(waiting_on)s END,
           wait_until = CASE WHEN EXISTS (SELECT 1 FROM early_signal) THEN NULL
                             ELSE %(wait_until)s::timestamptz END,
           updated_at = onward.now(),
           state_schema_version = %(state_schema_version)s, handbacks = 0,
           budget_attempts = coalesce(budget_attempts, %(default_attempts)s),
           budget_tokens = coalesce(budget_tokens, %(default_tokens)s),
           budget_cost_usd = coalesce(budget_cost_usd, %(default_cost)s),
           deadline_at = coalesce(deadline_at, %(default_deadline)s),
           finished_at = CASE WHEN %(status)s IN ('running', 'waiting') THEN NULL
                              ELSE onward.now() END
      FROM chain
     WHERE id = %(run_id)s AND seq = %(seq)s AND lease_epoch = %(epoch)s AND status = 'running'
       AND cancel_requested IS NULL
 RETURNING id, tenant_id, status, chain.go AS chained, lease_epoch, attempt, max_attempts,
           attempts_total, budget_attempts, budget_tokens, budget_cost_usd, deadline_at,
           used_tokens, used_cost_usd, created_at, workflow_version, state_schema_version,
           head_mac, priority, onward.now() AS claimed_at,
           extract(epoch FROM lease_expires_at - onward.now())::float8 AS lease_s
), signal_consumed AS (
    UPDATE onward.signals SET consumed_seq = %(seq)s + 1
     WHERE id IN (SELECT id FROM early_signal) AND consumed_seq IS NULL
       AND EXISTS (SELECT 1 FROM advanced)
), state_artifact AS (
    INSERT INTO onward.artifacts (sha256, size, media_type, body)
    SELECT %(artifact_sha)s, length(%(artifact_body)s::bytea), 'application/json',
           %(artifact_body)s FROM advanced WHERE %(artifact_sha)s::text IS NOT NULL
       -- held shared to commit: a sweep deleting unreferenced artifacts skips this one
       -- (ledger/artifact_sweep.py)
       AND pg_advisory_xact_lock_shared(%(artifact_lock)s, hashtext(%(artifact_sha)s))::text = ''
    ON CONFLICT (sha256) DO NOTHING
), checkpoint AS (
    INSERT INTO onward.checkpoints (run_id, seq, parent_hash, hash, key_id, envelope_version,
                                    step, next_step, outcome, state, workflow_version,
                                    lease_epoch, control, state_schema_version, refs,
                                    workflow, state_delta, snapshot_seq, chain_bytes)
    SELECT id, %(seq)s + 1, %(parent_hash)s, %(hash)s, %(key_id)s, %(envelope_version)s,
           %(step)s, %(next_step)s, %(outcome)s, %(state)s, %(workflow_version)s, %(epoch)s,
           %(control)s, %(state_schema_version)s, %(refs)s, %(workflow)s, %(state_delta)s,
           %(snapshot_seq)s, %(chain_bytes)s
      FROM advanced
), next_message AS (
    INSERT INTO onward.outbox (run_id, seq, due_at, worker_publishes, trace_context)
    SELECT id, %(seq)s + 1, coalesce(%(due_at)s, onward.now()),
           %(due_at)s::timestamptz IS NULL AND %(status)s = 'running', %(trace_context)s
      FROM advanced WHERE status = 'running' AND NOT chained
), recorded AS (
    -- the attempt of the step the commit claimed (chain): as the claim statement records it
    INSERT INTO onward.step_attempts (run_id, lease_epoch, seq, attempt, step, worker)
    SELECT id, lease_epoch, %(seq)s + 1, attempt, %(next_step)s, %(chain_owner)s
      FROM advanced WHERE chained
), approval AS (
    INSERT INTO onward.approvals (id, run_id, tenant_id, seq, workflow_version, step, action,
                                  artifact_hash, artifact, approvers, expires_at, status,
                                  created_at, terms_mac)
    SELECT %(approval_id)s, id, tenant_id, %(seq)s + 1, %(workflow_version)s, %(step)s,
           %(action)s, %(artifact_hash)s, %(artifact)s, %(approvers)s, %(expires_at)s,
           'pending', %(approval_created_at)s, %(terms_mac)s
      FROM advanced WHERE %(approval_id)s::uuid IS NOT NULL
), resent AS (
    -- a message the reaper queued again for this seq while the holder was slow: now stale
    DELETE FROM onward.outbox o USING advanced a WHERE o.run_id = a.id AND o.seq = %(seq)s
), {close_attempt(advanced)}
SELECT (SELECT count(*) FROM advanced) AS advanced,
       (SELECT cancel_requested IS NOT NULL FROM onward.runs WHERE id = %(run_id)s) AS cancelling,
       a.chained, a.lease_epoch, a.attempt, a.max_attempts, a.attempts_total, a.budget_attempts,
       a.budget_tokens, a.budget_cost_usd, a.deadline_at, a.used_tokens, a.used_cost_usd,
       a.created_at, a.workflow_version, a.state_schema_version, a.head_mac, a.priority,
       a.claimed_at, a.lease_s
  FROM (SELECT 1) AS one LEFT JOIN advanced a ON true

-- name: fail
-- Record a step error: retry through a delayed outbox row, or fail the run and close the
-- effects known never to have reached the provider. A run never fails while one of its
-- effects may have reached the provider (blocked_by names it).
WITH blocking AS (
    SELECT e.effect_type, e.effect_id FROM onward.effects e
     WHERE NOT %(retry)s AND e.run_id = %(run_id)s AND e.status IN ('pending', 'accepted')
       AND {outcome_unknown}
     LIMIT 1
), failed AS (
    UPDATE onward.runs
       SET lease_owner = NULL, lease_expires_at = NULL, last_error = %(error)s,
           waiting_on = NULL,
           status = CASE WHEN %(retry)s THEN 'running' ELSE 'failed' END,
           finished_at = CASE WHEN %(retry)s THEN NULL ELSE onward.now() END,
           updated_at = onward.now()
     WHERE id = %(run_id)s AND seq = %(seq)s AND lease_epoch = %(epoch)s AND status = 'running'
       AND NOT EXISTS (SELECT 1 FROM blocking)
 RETURNING id
), closed AS (
    -- the same statement closes the effects known never to have reached the provider
    UPDATE onward.effects e
       SET status = 'unsent', completed_at = onward.now(), updated_at = onward.now(),
           error = coalesce(e.error, '{}'::jsonb) || jsonb_build_object('closed_by', 'run failed')
      FROM failed f
     WHERE NOT %(retry)s AND e.run_id = f.id AND {never_landed}
), retry AS (
    INSERT INTO onward.outbox (run_id, seq, due_at, trace_context)
    SELECT id, %(seq)s, onward.now() + %(delay)s * interval '1 second', %(trace_context)s
      FROM failed WHERE %(retry)s
        ON CONFLICT (run_id, seq) DO UPDATE
       SET due_at = EXCLUDED.due_at, published_at = NULL, worker_publishes = false,
           trace_context = EXCLUDED.trace_context
), {close_attempt(failed)}
SELECT (SELECT count(*) FROM failed) AS failed,
       (SELECT effect_type || ' ' || effect_id FROM blocking) AS blocked_by

-- name: cancel
-- The worker honours a cancel request: end the run 'cancelled' once no effect of it has an
-- unknown outcome, closing its never-sent effects, its outbox rows and pending approvals.
WITH blocking AS (
    SELECT e.effect_type, e.effect_id FROM onward.effects e
     WHERE e.run_id = %(run_id)s AND e.status IN ('pending', 'accepted') AND {outcome_unknown}
     LIMIT 1
), cancelled AS (
    UPDATE onward.runs
       SET status = 'cancelled', finished_at = onward.now(), updated_at = onward.now(),
           lease_owner = NULL, lease_expires_at = NULL, waiting_on = NULL, wait_until = NULL,
           last_error = cancel_requested
     WHERE id = %(run_id)s AND lease_epoch = %(epoch)s AND status = 'running'
       AND cancel_requested IS NOT NULL AND NOT EXISTS (SELECT 1 FROM blocking)
 RETURNING id, cancel_requested
), closed AS (
    UPDATE onward.effects e
       SET status = 'unsent', completed_at = onward.now(), updated_at = onward.now(),
           error = coalesce(e.error, '{}'::jsonb)
                   || jsonb_build_object('closed_by', 'run cancelled')
      FROM cancelled c
     WHERE e.run_id = c.id AND {never_landed}
), dropped AS (
    DELETE FROM onward.outbox o USING cancelled c WHERE o.run_id = c.id
), invalidated AS (
    UPDATE onward.approvals a
       SET status = 'invalidated', decided_by = c.cancel_requested->>'by',
           decided_at = onward.now(),
           comment = 'run cancelled: ' || coalesce(c.cancel_requested->>'reason_text', '')
      FROM cancelled c
     WHERE a.run_id = c.id AND a.status = 'pending'
), {close_attempt(cancelled)}
SELECT (SELECT count(*) FROM cancelled) AS cancelled,
       (SELECT effect_type || ' ' || effect_id FROM blocking) AS blocked_by

-- name: park
-- Stop the run as needs_review, with its audit row: a person must look before anything runs.
WITH parked AS (
    UPDATE onward.runs
       SET status = 'needs_review', parked_reason = %(reason)s, last_error = %(error)s,
           lease_owner = NULL, lease_expires_at = NULL, updated_at = onward.now()
     WHERE id = %(run_id)s AND lease_epoch = %(epoch)s AND status = 'running'
 RETURNING id, tenant_id, seq
), audited AS (
    INSERT INTO onward.audit (tenant_id, actor, role, action, outcome, reason, run_id,
                              before_seq, after_seq, details, mac)
    SELECT tenant_id, 'onward-worker', 'system', 'park', 'done', %(reason)s, id, seq, seq,
           %(error)s, %(audit_mac)s
      FROM parked
), {close_attempt(parked)}
SELECT count(*) AS parked FROM parked

-- name: release
-- Give the lease back without running; with resend_in, queue the step again for the
-- dispatcher to route; spend keeps the claim's attempt counted.
WITH released AS (
    UPDATE onward.runs
       SET lease_owner = NULL, lease_expires_at = NULL,
           attempt = attempt - CASE WHEN %(spend)s THEN 0 ELSE 1 END,
           last_error = %(error)s, updated_at = onward.now()
     WHERE id = %(run_id)s AND lease_epoch = %(epoch)s AND status = 'running'
 RETURNING id, seq
), resend AS (
    INSERT INTO onward.outbox (run_id, seq, due_at)
    SELECT id, seq, onward.now() + %(resend_in)s * interval '1 second' FROM released
     WHERE %(resend_in)s::float8 IS NOT NULL
        ON CONFLICT (run_id, seq) DO NOTHING
), {close_attempt(released)}
SELECT count(*) AS released FROM released

-- name: hand_back
-- A worker that lacks the run's workflow or its (newer) version gives the step back: the
-- claim's attempt is not spent (neither attempt nor attempts_total), the hand-back is
-- counted, and the step is queued again after delay for the dispatcher to route; the last
-- allowed hand-back parks the run instead (its outbox row goes with it, migration 0009's
-- trigger).
WITH handed AS (
    UPDATE onward.runs
       SET lease_owner = NULL, lease_expires_at = NULL, attempt = attempt - 1,
           attempts_total = attempts_total - 1, handbacks = handbacks + 1,
           status = CASE WHEN %(park)s THEN 'needs_review' ELSE status END,
           parked_reason = CASE WHEN %(park)s THEN 'no_worker_for_version'
                                ELSE parked_reason END,
           last_error = %(error)s, updated_at = onward.now(),
           -- a new run whose input the claiming code's model rejected goes back unbound
           -- (or bound to an older version that accepts it, bind_version), unless a step
           -- at its seq acted or was answered
           (workflow_version, state_schema_version) = (
               SELECT CASE WHEN unbound THEN %(bind_version)s::int
                           ELSE runs.workflow_version END,
                      CASE WHEN unbound THEN %(bind_schema)s::int
                           ELSE runs.state_schema_version END
                 FROM (SELECT %(unbind)s::bool
                              AND NOT EXISTS (SELECT 1 FROM onward.effects e
                                               WHERE e.run_id = runs.id AND e.seq = runs.seq)
                              AND NOT EXISTS (SELECT 1 FROM onward.evidence v
                                               WHERE v.run_id = runs.id AND v.seq = runs.seq)
                              AS unbound) u)
     WHERE id = %(run_id)s AND lease_epoch = %(epoch)s AND status = 'running'
 RETURNING id, tenant_id, seq
), resend AS (
    INSERT INTO onward.outbox (run_id, seq, due_at)
    SELECT id, seq, onward.now() + %(delay)s * interval '1 second' FROM handed
     WHERE NOT %(park)s
        ON CONFLICT (run_id, seq) DO UPDATE
       SET due_at = EXCLUDED.due_at, published_at = NULL, worker_publishes = false
), audited AS (
    INSERT INTO onward.audit (tenant_id, actor, role, action, outcome, reason, run_id,
                              before_seq, after_seq, details, mac)
    SELECT tenant_id, 'onward-worker', 'system', 'park', 'done', 'no_worker_for_version', id,
           seq, seq, %(error)s, %(audit_mac)s
      FROM handed WHERE %(park)s
), {close_attempt(handed)}
SELECT count(*) AS handed FROM handed

-- name: defer
-- Pause the run without a worker: give the lease back (a status poll is not a step
-- execution: it spends no attempt budget) and wake the same step after delay.
WITH deferred AS (
    UPDATE onward.runs
       SET lease_owner = NULL, lease_expires_at = NULL, attempt = attempt - 1,
           attempts_total = attempts_total - 1,
           waiting_on = %(waiting_on)s, updated_at = onward.now()
     WHERE id = %(run_id)s AND seq = %(seq)s AND lease_epoch = %(epoch)s AND status = 'running'
 RETURNING id
), wake AS (
    INSERT INTO onward.outbox (run_id, seq, due_at)
    SELECT id, %(seq)s, onward.now() + %(delay)s * interval '1 second' FROM deferred
        ON CONFLICT (run_id, seq) DO UPDATE
       SET due_at = EXCLUDED.due_at, published_at = NULL, worker_publishes = false
), {close_attempt(deferred)}
SELECT count(*) AS deferred FROM deferred

-- name: lease_lost
-- The stale holder reports back: its attempt ends 'lease_lost' (more precise than the
-- 'worker_lost' a takeover or the reaper assumed when the lease expired).
UPDATE onward.step_attempts SET ended_at = coalesce(ended_at, onward.now()), outcome = 'lease_lost'
 WHERE run_id = %(run_id)s AND lease_epoch = %(epoch)s
   AND started_at = %(claimed_at)s::timestamptz  -- the partition key (see close_attempt)
   AND (outcome IS NULL OR outcome = 'worker_lost')
RETURNING run_id

-- name: heartbeat
-- Extend the live lease; a run being cancelled is not extended (cancelling says so).
WITH beat AS (
    UPDATE onward.runs
       SET lease_expires_at = greatest(lease_expires_at,
                                       onward.now() + %(ttl)s * interval '1 second')
     WHERE id = %(run_id)s AND lease_epoch = %(epoch)s AND status = 'running'
       AND cancel_requested IS NULL
    RETURNING lease_expires_at
)
SELECT (SELECT lease_expires_at FROM beat) AS lease_expires_at,
       (SELECT cancel_requested IS NOT NULL FROM onward.runs WHERE id = %(run_id)s) AS cancelling

-- name: run_position
-- Where a run stands (a corpus replay drives it step by step: tasks/corpus/replayer.py).
SELECT seq, status, workflow_version FROM onward.runs WHERE id = %(run_id)s
