-- What a replay or branch run reads of its parent's records (ledger/lineage.py).


-- name: replay_source
-- The run's lineage up to the nearest ancestor that made its own calls (not an evidence
-- replay), nearest first, with how each was launched: the caller checks every launch MAC.
WITH RECURSIVE chain AS (
    SELECT id, tenant_id, parent_run_id, parent_seq, mode, allow_irreversible, launch_mac,
           0 AS depth
      FROM onward.runs WHERE id = %(run_id)s
    UNION ALL
    SELECT r.id, r.tenant_id, r.parent_run_id, r.parent_seq, r.mode, r.allow_irreversible,
           r.launch_mac, c.depth + 1
      FROM onward.runs r JOIN chain c ON r.id = c.parent_run_id
     WHERE c.mode = 'evidence' AND c.depth < 1000
)
SELECT * FROM chain ORDER BY depth

-- name: approval_at
-- The latest approval the run asked for at seq.
SELECT * FROM onward.approvals
 WHERE run_id = %(run_id)s AND seq = %(seq)s ORDER BY created_at DESC LIMIT 1

-- name: step_after
-- The step the run ran after checkpoint seq.
SELECT step FROM onward.checkpoints WHERE run_id = %(run_id)s AND seq = %(seq)s + 1

-- name: effect_by_key
-- One effect, by type and id.
SELECT * FROM onward.effects WHERE effect_type = %(effect_type)s AND effect_id = %(effect_id)s

-- name: diverge
-- An evidence replay asked for something its parent never recorded: end it diverged, with
-- the report.
WITH diverged AS (
    UPDATE onward.runs
       SET status = 'diverged', last_error = %(report)s, lease_owner = NULL,
           lease_expires_at = NULL, waiting_on = NULL, finished_at = onward.now(),
           updated_at = onward.now()
     WHERE id = %(run_id)s AND lease_epoch = %(epoch)s AND status = 'running'
 RETURNING id
), {close_attempt(diverged)}
SELECT count(*) AS diverged FROM diverged

-- name: spent_before
-- What the parent had spent when it reached checkpoint ``seq``: its token and cost totals
-- (which include what it inherited itself, so a replay of a replay keeps the grandparent's
-- spend) minus what it spent from ``seq`` on. Attempts: the run's attempts_total when the
-- step that wrote checkpoint ``seq`` was claimed, as that step bound it under the MAC
-- (refs.budgets; a poll or a hand-back refunds its claim, so counting rows cannot tell);
-- checkpoints without it (start, fork, migration) count the claims from ``seq`` on. One
-- statement, so one snapshot of a live parent.
SELECT greatest(r.used_tokens - coalesce(
           (SELECT sum(e.input_tokens + e.output_tokens) FROM onward.evidence e
             WHERE e.run_id = r.id AND e.seq >= %(seq)s), 0), 0) AS tokens,
       greatest(r.used_cost_usd - coalesce(
           (SELECT sum(e.cost_usd) FROM onward.evidence e
             WHERE e.run_id = r.id AND e.seq >= %(seq)s), 0), 0) AS cost_usd,
       coalesce(
           (SELECT (c.refs -> 'budgets' ->> 'attempts')::int FROM onward.checkpoints c
             WHERE c.run_id = r.id AND c.seq = %(seq)s),
           greatest(r.attempts_total - (
               SELECT count(*) FROM onward.step_attempts a
                WHERE a.run_id = r.id AND a.seq >= %(seq)s
                  AND a.outcome IS DISTINCT FROM 'waiting'), 0)) AS attempts
  FROM onward.runs r WHERE r.id = %(run_id)s
