-- Retention (ledger/retention.py): which terminal runs a policy makes due for compaction.


-- name: retention_candidates
-- Terminal runs of one policy (tenant and workflow, '*' for any) finished more than its
-- days ago that still have a kind of payload left (ledger/retention.py Kind), after run id
-- `after` (NULL: from the start), in run id order, leaving out a run with a replay or branch
-- still going; with its age in seconds, whether it is on legal hold or in a corpus (kept,
-- but reported), and per kind what is left and its stored size: uncompacted checkpoints
-- (with signals' payloads), evidence responses not yet digests (or their sealed requests),
-- effects' payloads, recipients and unsealed results and approvals' artifacts not yet
-- dropped, step attempts.
SELECT r.id, r.tenant_id, r.workflow, r.legal_hold IS NOT NULL AS held,
       extract(epoch FROM onward.now() - r.finished_at) AS age_s,
       EXISTS (SELECT 1 FROM onward.corpus_runs p WHERE p.run_id = r.id) AS pinned,
       c.checkpoints, c.bytes + g.bytes AS states_bytes,
       e.left_ AS evidence_left, e.bytes AS evidence_bytes,
       f.left_ + a.left_ AS artifacts_left, f.bytes + a.bytes AS artifacts_bytes,
       t.attempts
  FROM onward.runs r
  CROSS JOIN LATERAL (
      SELECT count(*) AS checkpoints,
             coalesce(sum(coalesce(pg_column_size(k.state), 0)
                          + coalesce(pg_column_size(k.state_delta), 0)), 0) AS bytes
        FROM onward.checkpoints k WHERE k.run_id = r.id AND k.compacted_mac IS NULL
  ) c
  CROSS JOIN LATERAL (
      SELECT coalesce(sum(pg_column_size(s.payload)), 0) AS bytes
        FROM onward.signals s WHERE s.run_id = r.id AND NOT s.payload ? '$compacted'
  ) g
  CROSS JOIN LATERAL (
      SELECT count(*) AS left_,
             coalesce(sum(coalesce(pg_column_size(v.response), 0)
                          + coalesce(pg_column_size(v.request), 0)), 0) AS bytes
        FROM onward.evidence v
       WHERE v.run_id = r.id
         AND (v.artifact_sha256 IS NOT NULL OR NOT v.response ? '$compacted'
              OR v.request IS NOT NULL)
  ) e
  CROSS JOIN LATERAL (
      SELECT count(*) AS left_,
             coalesce(sum(coalesce(pg_column_size(x.payload), 0)
                          + coalesce(pg_column_size(x.result), 0)), 0) AS bytes
        FROM onward.effects x
       WHERE x.run_id = r.id
         AND ((x.payload IS NOT NULL AND x.payload <> '{"$dropped": true}'::jsonb)
              OR x.recipient IS NOT NULL
              OR (x.outcome_mac IS NOT NULL AND x.result IS NOT NULL
                  AND NOT x.result ? '$compacted'))
  ) f
  CROSS JOIN LATERAL (
      SELECT count(*) AS left_, coalesce(sum(pg_column_size(y.artifact)), 0) AS bytes
        FROM onward.approvals y
       WHERE y.run_id = r.id AND y.artifact <> '{"$dropped": true}'::jsonb
  ) a
  CROSS JOIN LATERAL (
      SELECT EXISTS (SELECT 1 FROM onward.step_attempts z WHERE z.run_id = r.id) AS attempts
  ) t
 WHERE r.status = ANY(%(terminal)s)
   AND r.finished_at < onward.now() - %(days)s * interval '1 day'
   AND (%(tenant)s = '*' OR r.tenant_id = %(tenant)s)
   AND (%(workflow)s = '*' OR r.workflow = %(workflow)s)
   AND (c.checkpoints > 0 OR e.left_ > 0 OR f.left_ + a.left_ > 0 OR t.attempts)
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
