-- Numbers for monitoring (ledger/health.py): counters from metric_totals, gauges of what
-- is active, each through an index on the column that selects it.

-- name: add_totals
-- Add a worker process's counter deltas to the totals (one row per workflow version, metric
-- and label).
INSERT INTO onward.metric_totals (workflow, version, metric, label, value, updated_at)
SELECT t.workflow, t.version, t.metric, t.label, t.value, onward.now()
  FROM jsonb_to_recordset(%(rows)s) AS t(workflow text, version int, metric text, label text,
                                         value float8)
 ORDER BY 1, 2, 3, 4  -- one lock order for every writer: no deadlock between two flushes
ON CONFLICT (workflow, version, metric, label)
DO UPDATE SET value = onward.metric_totals.value + EXCLUDED.value, updated_at = onward.now()
RETURNING 1

-- name: totals
SELECT workflow, version, metric, label, value FROM onward.metric_totals

-- name: active_runs
-- Runs that are not terminal, through ix_runs_status. For parked runs
-- the reason, for waiting runs what they wait for (approval, signal, effect, …).
SELECT workflow, coalesce(workflow_version, 0) AS version, status,
       CASE status WHEN 'needs_review' THEN coalesce(parked_reason, 'unknown')
                   WHEN 'waiting' THEN coalesce(split_part(waiting_on, ':', 1), 'unknown')
                   ELSE '' END AS why,
       count(*) AS n
  FROM onward.runs WHERE status IN ('running', 'waiting', 'needs_review')
 GROUP BY 1, 2, 3, 4

-- name: restores
-- Restores (attempts whose worker was lost), by workflow version, through a partial index.
SELECT r.workflow, coalesce(r.workflow_version, 0) AS version, count(*) AS n
  FROM onward.step_attempts a JOIN onward.runs r ON r.id = a.run_id
 WHERE a.outcome = 'worker_lost'
 GROUP BY 1, 2

-- name: unresolved_effects_by_version
-- Effects not resolved yet, by workflow version and status, with the oldest's age.
SELECT r.workflow, coalesce(r.workflow_version, 0) AS version, e.status, count(*) AS n,
       extract(epoch FROM onward.now() - min(e.updated_at))::float8 AS oldest_s
  FROM onward.effects e JOIN onward.runs r ON r.id = e.run_id
 WHERE e.status IN ('pending', 'accepted')
 GROUP BY 1, 2, 3

-- name: outbox_lag
-- Due rows, and how long the oldest has waited for a publish it should have had: rows the
-- dispatcher owns at once, rows a worker publishes itself after the grace period.
SELECT r.workflow, coalesce(r.workflow_version, 0) AS version, count(*) AS due,
       coalesce(extract(epoch FROM onward.now() - min(o.due_at) FILTER (
           WHERE o.published_at IS NULL
             AND (NOT o.worker_publishes
                  OR o.created_at < onward.now() - %(grace)s * interval '1 second'))), 0)::float8
           AS lag_s
  FROM onward.outbox o JOIN onward.runs r ON r.id = o.run_id
 WHERE o.due_at <= onward.now()
 GROUP BY 1, 2

-- name: pending_approvals
-- Pending approvals by workflow are the runs waiting on one (_ACTIVE_RUNS, kind approval);
-- the oldest comes from the partial index on pending approvals, with no join to runs.
SELECT count(*) AS n,
       coalesce(extract(epoch FROM onward.now() - min(created_at)), 0)::float8 AS oldest_s
  FROM onward.approvals WHERE status = 'pending'

-- name: served_versions
-- The workflow versions live workers advertise.
SELECT DISTINCT workflow, version FROM onward.worker_queues
 WHERE seen_at > onward.now() - %(within)s * interval '1 second'

-- name: live_workers
-- Live workers and the steps they have in flight.
SELECT count(*) AS n, coalesce(sum(in_flight), 0) AS in_flight FROM onward.workers
 WHERE seen_at > onward.now() - %(within)s * interval '1 second'
