-- Retention (ledger/retention.py): which terminal runs a policy makes due for compaction.


-- name: retention_candidates
-- Terminal runs of one policy (tenant and workflow, '*' for any) finished more than its
-- days ago that still have uncompacted checkpoints, after run id `after` (NULL: from the
-- start), in run id order; with whether each is on legal hold or in a corpus (kept,
-- but reported) and its uncompacted checkpoints' count and stored size.
SELECT r.id, r.tenant_id, r.workflow, r.legal_hold IS NOT NULL AS held,
       EXISTS (SELECT 1 FROM onward.corpus_runs p WHERE p.run_id = r.id) AS pinned,
       c.checkpoints, c.bytes
  FROM onward.runs r
  CROSS JOIN LATERAL (
      SELECT count(*) AS checkpoints,
             coalesce(sum(coalesce(pg_column_size(k.state), 0)
                          + coalesce(pg_column_size(k.state_delta), 0)), 0) AS bytes
        FROM onward.checkpoints k WHERE k.run_id = r.id AND k.compacted_mac IS NULL
  ) c
 WHERE r.status = ANY(%(terminal)s)
   AND r.finished_at < onward.now() - %(days)s * interval '1 day'
   AND (%(tenant)s = '*' OR r.tenant_id = %(tenant)s)
   AND (%(workflow)s = '*' OR r.workflow = %(workflow)s)
   AND c.checkpoints > 0 AND (CAST(%(after)s AS uuid) IS NULL OR r.id > CAST(%(after)s AS uuid))
 ORDER BY r.id
 LIMIT %(limit)s
