-- The reaper's sweeps (ledger/recovery.py): lost leases, spent budgets, lost messages.

-- name: requeue_expired
-- Lease expired and attempts remain: give the step back to the fleet (a restore).
WITH expired AS (
    SELECT id FROM onward.runs
     WHERE status = 'running' AND lease_expires_at < onward.now() AND attempt < max_attempts
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), requeued AS (
    UPDATE onward.runs r
       SET lease_owner = NULL, lease_expires_at = NULL, restore_count = restore_count + 1,
           last_error = jsonb_build_object(
               'type', 'WorkerLost',
               'message', format('worker %%s lost the lease of step %%s at seq %%s (attempt %%s)',
                                 r.lease_owner, coalesce(r.step, '(start)'), r.seq, r.attempt)),
           updated_at = onward.now()
      FROM expired WHERE r.id = expired.id
 RETURNING r.id, r.seq, r.lease_epoch
), lost AS (
    UPDATE onward.step_attempts a SET outcome = 'worker_lost', ended_at = onward.now()
      FROM requeued q WHERE a.run_id = q.id AND a.lease_epoch = q.lease_epoch
       AND a.outcome IS NULL
), resend AS (
    INSERT INTO onward.outbox (run_id, seq) SELECT id, seq FROM requeued
        ON CONFLICT (run_id, seq) DO UPDATE
       SET published_at = NULL, worker_publishes = false, due_at = onward.now()
)
SELECT count(*) FROM requeued

-- name: park_exhausted
-- The attempt budget is spent and nobody holds the step: a step that keeps killing its
-- worker (lease expired), or one that no worker can run (handed back every time).
WITH exhausted AS (
    SELECT id FROM onward.runs
     WHERE status = 'running' AND attempt >= max_attempts
       AND (lease_expires_at IS NULL OR lease_expires_at < onward.now())
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), parked AS (
    UPDATE onward.runs r
       SET status = 'needs_review', parked_reason = 'attempts_exhausted',
           lease_owner = NULL, lease_expires_at = NULL, updated_at = onward.now(),
           last_error = jsonb_build_object(
               'type', CASE WHEN r.lease_owner IS NULL THEN 'NoWorkerCanRun' ELSE 'WorkerLost' END,
               'message', CASE WHEN r.lease_owner IS NULL
                    THEN format('no worker could run step %%s at seq %%s in %%s attempts: %%s',
                                coalesce(r.step, '(start)'), r.seq, r.attempt,
                                CASE WHEN jsonb_typeof(r.last_error->'message') = 'object'
                                     THEN '*** (sealed: see previous)'
                                     ELSE coalesce(r.last_error->>'message', 'no error recorded')
                                END)
                    ELSE format('step %%s at seq %%s lost its worker on all %%s attempts; '
                                'the last holder was %%s',
                                coalesce(r.step, '(start)'), r.seq, r.attempt, r.lease_owner)
                    END,
               'previous', r.last_error)
      FROM exhausted WHERE r.id = exhausted.id
 RETURNING r.id, r.lease_epoch
), lost AS (
    UPDATE onward.step_attempts a SET outcome = 'worker_lost', ended_at = onward.now()
      FROM parked p WHERE a.run_id = p.id AND a.lease_epoch = p.lease_epoch
       AND a.outcome IS NULL
)
SELECT count(*) FROM parked

-- name: resend_stalled
-- Runnable, no lease, no message in the outbox, no progress: the message was lost
-- somewhere.
WITH stalled AS (
    SELECT r.id, r.seq FROM onward.runs r
     WHERE r.status = 'running' AND r.lease_expires_at IS NULL
       AND r.updated_at < onward.now() - %(stall_s)s * interval '1 second'
       AND NOT EXISTS (SELECT 1 FROM onward.outbox o WHERE o.run_id = r.id AND o.seq = r.seq)
     LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED
), resend AS (
    INSERT INTO onward.outbox (run_id, seq) SELECT id, seq FROM stalled
    ON CONFLICT (run_id, seq) DO NOTHING
    RETURNING run_id
)
UPDATE onward.runs r SET restore_count = restore_count + 1, updated_at = onward.now()
  FROM resend WHERE r.id = resend.run_id
