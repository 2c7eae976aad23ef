-- Retention (ledger/retention.py): which terminal runs a policy makes due for compaction.


-- name: retention_candidates
-- Terminal runs of one policy (tenant and workflow, '*' for any) finished more than its
-- days ago that still have uncompacted checkpoints or step attempts (a compacted run has
-- none left), after run id `after` (NULL: from the start), in run id order, leaving out a
-- run with a replay or branch still going; with whether each is on legal hold or in a
-- corpus (kept, but reported), its uncompacted checkpoints' count and the stored size of
-- its states and payloads (evidence, effects, approval artifacts, signals).
SELECT r.id, r.tenant_id, r.workflow, r.legal_hold IS NOT NULL AS held,
       EXISTS (SELECT 1 FROM onward.corpus_runs p WHERE p.run_id = r.id) AS pinned,
       c.checkpoints, c.bytes + p.bytes AS bytes
  FROM onward.runs r
  CROSS JOIN LATERAL (
      SELECT count(*) AS checkpoints,
             coalesce(sum(coalesce(pg_column_size(k.state), 0)
                          + coalesce(pg_column_size(k.state_delta), 0)), 0) AS bytes
        FROM onward.checkpoints k WHERE k.run_id = r.id AND k.compacted_mac IS NULL
  ) c
  CROSS JOIN LATERAL (
      SELECT (SELECT coalesce(sum(pg_column_size(e.response)), 0)
                FROM onward.evidence e WHERE e.run_id = r.id)
           + (SELECT coalesce(sum(coalesce(pg_column_size(f.payload), 0)
                                  + coalesce(pg_column_size(f.result), 0)), 0)
                FROM onward.effects f WHERE f.run_id = r.id)
           + (SELECT coalesce(sum(pg_column_size(a.artifact)), 0)
                FROM onward.approvals a WHERE a.run_id = r.id)
           + (SELECT coalesce(sum(pg_column_size(s.payload)), 0)
                FROM onward.signals s WHERE s.run_id = r.id) AS bytes,
             EXISTS (SELECT 1 FROM onward.step_attempts t WHERE t.run_id = r.id) AS attempts
  ) p
 WHERE r.status = ANY(%(terminal)s)
   AND r.finished_at < onward.now() - %(days)s * interval '1 day'
   AND (%(tenant)s = '*' OR r.tenant_id = %(tenant)s)
   AND (%(workflow)s = '*' OR r.workflow = %(workflow)s)
   AND (c.checkpoints > 0 OR p.attempts)
   AND NOT EXISTS (SELECT 1 FROM onward.runs ch
                    WHERE ch.parent_run_id = r.id AND NOT ch.status = ANY(%(terminal)s))
   AND (CAST(%(after)s AS uuid) IS NULL OR r.id > CAST(%(after)s AS uuid))
 ORDER BY r.id
 LIMIT %(limit)s

-- name: keep_lock_shared
-- Taken by a legal hold and a corpus pin before they write: a partition drop, which holds
-- this lock exclusively from its check to its commit, waits for them or they for it.
SELECT pg_advisory_xact_lock_shared(%(k)s)

-- name: keep_lock
-- Taken by a partition drop before it checks whether the policies let go of a month.
SELECT pg_advisory_xact_lock(%(k)s)
