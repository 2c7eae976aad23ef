-- Durable waits (ledger/waits.py): approvals, signals, timers and deadlines.


-- name: wake_on_signal
-- Wake a run waiting on a signal that has already arrived (psycopg parameter style; used by
-- Ledger.signal; a signal stored before the wait began is consumed by the waiting commit).
WITH sig AS (
    SELECT s.id FROM onward.signals s JOIN onward.runs r ON r.id = s.run_id
     WHERE s.run_id = %(run_id)s AND r.seq = %(seq)s AND r.status = 'waiting'
       AND r.waiting_on = 'signal:' || s.name AND s.consumed_seq IS NULL
     ORDER BY s.id LIMIT 1
       FOR UPDATE OF s
), woke AS (
    UPDATE onward.runs SET status = 'running', waiting_on = NULL, wait_until = NULL,
           updated_at = onward.now()
     WHERE id = %(run_id)s AND seq = %(seq)s AND status = 'waiting'
       AND EXISTS (SELECT 1 FROM sig)
 RETURNING id
), consumed AS (
    UPDATE onward.signals SET consumed_seq = %(seq)s
     WHERE id IN (SELECT id FROM sig) AND EXISTS (SELECT 1 FROM woke)
)
INSERT INTO onward.outbox (run_id, seq) SELECT id, %(seq)s FROM woke
ON CONFLICT (run_id, seq) DO NOTHING
RETURNING run_id

-- name: next_signal_id
-- The id of a signal being sent (Ledger.signal), taken holding the advisory lock
-- onward.signal_ids shared to the send's commit: a corpus import moves the sequence past a
-- bundle's ids holding it exclusively (onward.signal_ids_past, migration 0044), so an id is
-- never taken while the sequence is being moved. The lock is taken first (the CTE's row).
WITH held AS MATERIALIZED (
    SELECT pg_advisory_xact_lock_shared(hashtextextended('onward.signal_ids', 0))
)
SELECT nextval('onward.signals_id_seq') FROM held

-- name: due_approvals
-- Locks are taken run row first, then approval, as cancel and decide take them, so the
-- reaper cannot deadlock with them: the runs of due approvals are locked (skipping those a
-- command holds), then their approvals are expired.
SELECT a.id FROM onward.approvals a JOIN onward.runs r ON r.id = a.run_id
 WHERE a.status = 'pending' AND a.expires_at < onward.now()
 LIMIT %(limit)s
   FOR UPDATE OF r SKIP LOCKED

-- name: expire_approvals
-- Expire the given pending approvals past their time; the runs still waiting on them, with
-- their wait's control.
WITH expired AS (
    UPDATE onward.approvals SET status = 'expired'
     WHERE id = ANY(%(ids)s) AND status = 'pending' AND expires_at < onward.now()
 RETURNING id, run_id, seq
)
SELECT e.id, e.run_id, e.seq, c.control FROM expired e
  JOIN onward.runs r ON r.id = e.run_id AND r.seq = e.seq AND r.status = 'waiting'
                    AND r.waiting_on = 'approval:' || e.id::text
  JOIN onward.checkpoints c ON c.run_id = e.run_id AND c.seq = e.seq

-- name: wake_signalled
-- A run waits on a signal that is stored and unconsumed: the signal committed while the
-- commit that began the wait was running (outside its snapshot), or before a crash of code
-- that consumed early signals in a second statement. Wake it as the signal would have.
WITH due AS (
    SELECT r.id AS run_id, r.seq, r.waiting_on FROM onward.runs r
     WHERE r.status = 'waiting'
       AND EXISTS (SELECT 1 FROM onward.signals s
                    WHERE s.run_id = r.id AND s.consumed_seq IS NULL
                      AND r.waiting_on = 'signal:' || s.name)
     LIMIT %(limit)s
       FOR UPDATE OF r SKIP LOCKED
), first_signal AS (
    SELECT DISTINCT ON (d.run_id) d.run_id, d.seq, s.id AS signal_id
      FROM due d JOIN onward.signals s
        ON s.run_id = d.run_id AND s.consumed_seq IS NULL AND d.waiting_on = 'signal:' || s.name
     ORDER BY d.run_id, s.id
), woke AS (
    UPDATE onward.runs r SET status = 'running', waiting_on = NULL, wait_until = NULL,
           updated_at = onward.now()
      FROM first_signal f WHERE r.id = f.run_id
 RETURNING r.id, r.seq
), consumed AS (
    UPDATE onward.signals s SET consumed_seq = f.seq
      FROM first_signal f WHERE s.id = f.signal_id AND s.consumed_seq IS NULL
)
INSERT INTO onward.outbox (run_id, seq) SELECT id, seq FROM woke
ON CONFLICT (run_id, seq) DO UPDATE SET due_at = onward.now(), published_at = NULL,
                                        worker_publishes = false

-- name: signal_timeouts
-- Runs whose signal wait timed out, locked, with their wait's control.
SELECT r.id AS run_id, r.seq, c.control FROM onward.runs r
  JOIN onward.checkpoints c ON c.run_id = r.id AND c.seq = r.seq
 WHERE r.status = 'waiting' AND r.wait_until < onward.now()
 LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED

-- name: queue_now
-- Queue the run's current step now. cut a retry backoff or a status poll's delay short; a
-- row already due is left as it is
INSERT INTO onward.outbox (run_id, seq)
SELECT id, seq FROM onward.runs WHERE id = %(run_id)s
    ON CONFLICT (run_id, seq) DO UPDATE
   SET due_at = onward.now(), published_at = NULL, worker_publishes = false
 WHERE onward.outbox.due_at > onward.now()

-- name: past_deadline
-- Runs past their deadline that no worker holds, locked.
SELECT id AS run_id, status, deadline_at, attempts_total, used_tokens, used_cost_usd
  FROM onward.runs
 WHERE deadline_at < onward.now()
   AND (status = 'waiting'
        OR (status = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < onward.now())))
 LIMIT %(limit)s FOR UPDATE SKIP LOCKED

-- name: unknown_effect
-- An effect of the run whose outcome at the provider is unknown (the first, if any).
SELECT e.effect_type, e.effect_id FROM onward.effects e
 WHERE e.run_id = %(run_id)s AND e.status IN ('pending', 'accepted') AND {outcome_unknown}
 ORDER BY e.seq, e.created_at LIMIT 1

-- name: close_unsent
-- Close the run's effects known never to have reached the provider (unsent), saying why.
UPDATE onward.effects e
   SET status = 'unsent', completed_at = onward.now(), updated_at = onward.now(),
       error = coalesce(e.error, '{}'::jsonb)
               || jsonb_build_object('closed_by', CAST(%(closed_by)s AS text))
 WHERE e.run_id = %(run_id)s AND {never_landed}

-- name: queue_step
-- Queue the run's step at seq now (a resumed wait), whatever was queued for it before.
INSERT INTO onward.outbox (run_id, seq) VALUES (%(run_id)s, %(seq)s)
ON CONFLICT (run_id, seq) DO UPDATE SET due_at = onward.now(), published_at = NULL,
                                        worker_publishes = false

-- name: read_approval
-- The approval a resumed step reads its decision from (status, who, comment).
SELECT id, run_id, seq, action, status, decided_by, decided_at, comment,
       artifact_hash, artifact, expires_at, decision_mac,
       onward.now() < expires_at AS unexpired
  FROM onward.approvals WHERE id = %(id)s

-- name: read_approval_for_step
-- The approval a resumed step acts on, with step_started_at: when the first claim of that
-- step at seq started (a claim that handed the step back without running it does not count).
SELECT id, run_id, tenant_id, seq, workflow_version, step, action, status,
       decided_by, decided_at, comment, artifact_hash, artifact, approvers, created_at,
       expires_at, decision_mac, terms_mac,
       onward.now() < expires_at AS unexpired,
       (SELECT min(s.started_at) FROM onward.step_attempts s
         WHERE s.run_id = %(run_id)s AND s.seq = %(seq)s
           AND s.outcome IS DISTINCT FROM 'released') AS step_started_at
  FROM onward.approvals WHERE id = %(id)s

-- name: signal_payload
-- The signal name that ended the run's wait at seq: its payload and MAC (check it first).
SELECT id, run_id, name, payload, mac FROM onward.signals
 WHERE run_id = %(run_id)s AND name = %(name)s AND consumed_seq = %(seq)s

-- name: effects_at_seq
-- The effects the step at seq of run_id requested. Read only for an approved step retried
-- after its approval expired (with evidence_at_seq): what its attempt in time recorded.
SELECT * FROM onward.effects WHERE run_id = %(run_id)s AND seq = %(seq)s

-- name: evidence_at_seq
-- The answers the step at seq of run_id recorded, with the body of one stored as an
-- artifact (as checked_response needs them).
SELECT e.*, a.body AS artifact_body
  FROM onward.evidence e
  LEFT JOIN onward.artifacts a ON a.sha256 = e.artifact_sha256
 WHERE e.run_id = %(run_id)s AND e.seq = %(seq)s
