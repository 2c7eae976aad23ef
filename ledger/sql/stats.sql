-- Counts over a batch of runs (ledger/stats.py), for the demo and the benchmarks.


-- name: batch_stats
-- What happened to a batch of runs: outcomes, steps committed, duplicates, re-executions,
-- gaps, restores.
WITH r AS (SELECT * FROM onward.runs WHERE id = ANY(%(ids)s)),
attempts AS (SELECT * FROM onward.step_attempts WHERE run_id = ANY(%(ids)s)),
cps AS (SELECT * FROM onward.checkpoints WHERE run_id = ANY(%(ids)s)),
per_run AS (SELECT run_id, count(*) AS n, max(seq) AS top FROM cps GROUP BY run_id)
SELECT
  (SELECT count(*) FROM r) AS runs,
  (SELECT count(*) FROM r WHERE status = 'completed') AS completed,
  (SELECT count(*) FROM r WHERE status = 'failed') AS failed,
  (SELECT count(*) FROM r WHERE status = 'needs_review') AS parked,
  (SELECT count(*) FROM cps WHERE seq > 0) AS steps_committed,
  (SELECT count(*) FROM (SELECT 1 FROM attempts WHERE outcome = 'committed'
                          GROUP BY run_id, seq HAVING count(*) > 1) d) AS duplicate_commits,
  (SELECT count(*) FROM attempts a JOIN cps c ON c.run_id = a.run_id AND c.seq = a.seq + 1
    WHERE a.started_at > c.created_at) AS completed_steps_reexecuted,
  (SELECT count(*) FROM attempts WHERE outcome IS DISTINCT FROM 'committed')
      AS uncommitted_attempts,
  -- a run at seq n has exactly the checkpoints 0..n (one per seq: UNIQUE (run_id, seq))
  (SELECT count(*) FROM r LEFT JOIN per_run p ON p.run_id = r.id
    WHERE coalesce(p.n, 0) <> r.seq + 1 OR p.top IS DISTINCT FROM r.seq) AS runs_with_gaps,
  (SELECT coalesce(sum(stale_deliveries), 0) FROM r) AS stale_deliveries,
  (SELECT coalesce(sum(restore_count), 0) FROM r) AS restores
