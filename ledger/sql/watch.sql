-- Waiting for a run (ledger/watch.py): what a watcher reads when notified.

-- name: watched_run
-- The run a watcher waits on, in its tenant.
SELECT * FROM onward.runs WHERE id = %(run_id)s AND tenant_id = %(tenant_id)s

-- name: watched_steps
-- The steps a run committed since the watcher last looked.
SELECT seq, step, outcome, next_step FROM onward.checkpoints
WHERE run_id = %(run_id)s AND seq > %(after)s AND seq <= %(upto)s ORDER BY seq

-- name: watch_run
-- A watcher starts waiting on the run (counted, so the commit notifies only watched runs).
UPDATE onward.runs SET watchers = watchers + 1 WHERE id = %(run_id)s AND tenant_id = %(tenant_id)s

-- name: unwatch_run
-- A watcher stops waiting on the run.
UPDATE onward.runs SET watchers = greatest(watchers - 1, 0)
 WHERE id = %(run_id)s AND tenant_id = %(tenant_id)s
