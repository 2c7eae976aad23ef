-- Fleet-wide limits and per-call retry counts (ledger/limits.py): one statement each on
-- the worker's autocommit connection; onward.limit_acquire and onward.limit_release are
-- PL/pgSQL functions (migration 0032).


-- name: count_call_failure
-- Count one more failure of a call its retry policy retries, under the caller's live lease.
INSERT INTO onward.call_retries AS c (run_id, seq, command_id, failures, last_error)
SELECT id, %(seq)s, %(command_id)s, 1, %(error)s FROM onward.runs
 WHERE id = %(run_id)s AND lease_epoch = %(epoch)s AND status = 'running'
ON CONFLICT (run_id, seq, command_id) DO UPDATE
   SET failures = c.failures + 1, last_error = EXCLUDED.last_error, updated_at = onward.now()
RETURNING failures

-- name: call_failures
-- How often the call failed so far.
SELECT failures FROM onward.call_retries
 WHERE run_id = %(run_id)s AND seq = %(seq)s AND command_id = %(command_id)s

-- name: acquire_limit
-- Take a slot of a limit for a call, or learn when to try again.
SELECT granted, retry_in_s, in_use, waiting FROM onward.limit_acquire(
    %(key)s, %(name)s, %(concurrency)s, %(rate_count)s, %(rate_window_s)s, %(run_id)s,
    %(seq)s, %(command_id)s, %(epoch)s, %(rank)s, %(hold_s)s, %(wait_s)s, %(grace_s)s)

-- name: release_limit
-- Give the call's slot back, waking the next waiter.
SELECT onward.limit_release(%(key)s, %(run_id)s, %(command_id)s, %(epoch)s, %(grace_s)s)
       AS woken

-- name: limit_states
SELECT l.key, l.name, l.concurrency, l.rate_count, l.rate_window_s, l.granted, l.throttled,
       l.declared_at,
       (SELECT count(*) FROM onward.limit_grants g WHERE g.key = l.key
           AND g.released_at IS NULL AND g.expires_at > onward.now()) AS in_use,
       (SELECT count(*) FROM onward.limit_grants g WHERE g.key = l.key
           AND g.granted_at > onward.now()
                              - coalesce(l.rate_window_s, 0) * interval '1 second')
           AS started_in_window,
       (SELECT count(*) FROM onward.limit_waiters w JOIN onward.runs r ON r.id = w.run_id
         WHERE w.key = l.key AND w.expires_at > onward.now() AND r.status = 'running'
           AND r.seq = w.seq) AS waiting
  FROM onward.limits l ORDER BY l.key
