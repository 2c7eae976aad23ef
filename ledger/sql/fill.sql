-- Filling a ledger with made-up history (ledger/fill.py) for benchmarks (bench/console.py):
-- set-based inserts, one statement per kind of row. Never on a ledger with real runs.

-- fragment: fill_run_id
-- Run ids are uuid7-shaped (time-ordered): a millisecond prefix, then the row number g.
(lpad(to_hex((extract(epoch FROM onward.now()) * 1000)::bigint - %(n)s + g), 12, '0') || '7000' || '8' || lpad(to_hex(g), 15, '0'))::uuid

-- name: fill_runs
-- n runs of two workflows in a mix of statuses, newest last.
INSERT INTO onward.runs (id, tenant_id, workflow, workflow_version, status, seq, step,
                         max_attempts, head_hash, attempts_total, created_at, updated_at,
                         finished_at)
SELECT {fill_run_id}, %(tenant)s,
       CASE WHEN g %% 3 = 0 THEN 'research_agent' ELSE 'sales_offer_agent' END, 1 + g %% 2,
       CASE WHEN g %% 50 = 0 THEN 'needs_review' WHEN g %% 7 = 0 THEN 'failed'
            WHEN g %% 11 = 0 THEN 'running' ELSE 'completed' END,
       5, NULL, 3, 'bench', 5, onward.now() - make_interval(secs => %(n)s - g),
       onward.now(), onward.now()
  FROM generate_series(1, %(n)s) AS g

-- name: fill_approvals
-- The newest n runs wait, each for one pending approval.
WITH waiting AS (
    UPDATE onward.runs SET status = 'waiting', waiting_on = 'approval:bench', finished_at = NULL
     WHERE id IN (SELECT id FROM onward.runs WHERE tenant_id = %(tenant)s
                   ORDER BY id DESC LIMIT %(n)s)
 RETURNING id, seq, created_at
)
INSERT INTO onward.approvals (id, run_id, tenant_id, seq, workflow_version, step, action,
                              artifact_hash, artifact, approvers, expires_at, status,
                              created_at)
SELECT gen_random_uuid(), id, %(tenant)s, seq, 1, 'ask', 'send_offer', repeat('a', 64),
       jsonb_build_object('customer', 'c-' || left(id::text, 8), 'amount', 1000),
       '["role:sales_lead"]'::jsonb, onward.now() + interval '7 days', 'pending', created_at
  FROM waiting

-- name: fill_long_run
-- One run with steps committed steps (checkpoints and step executions).
WITH run AS (
    INSERT INTO onward.runs (id, tenant_id, workflow, workflow_version, status, seq, step,
                             max_attempts, head_hash, attempts_total, created_at, updated_at)
    VALUES (%(run_id)s, %(tenant)s, 'long_agent', 1, 'running', %(steps)s, 'loop', 3, 'bench',
            %(steps)s, onward.now() - interval '1 hour', onward.now())
    RETURNING id
), cps AS (
    INSERT INTO onward.checkpoints (run_id, seq, parent_hash, hash, key_id, envelope_version,
                                    step, next_step, outcome, state, workflow_version,
                                    lease_epoch, created_at)
    SELECT (SELECT id FROM run), g, CASE WHEN g > 0 THEN 'h' || (g - 1) END, 'h' || g,
           'bench', 1, CASE WHEN g > 0 THEN 'loop' END, 'loop',
           CASE WHEN g = 0 THEN 'start' ELSE 'goto' END,
           jsonb_build_object('i', g, 'notes', repeat('x', 200)), 1, g,
           onward.now() - make_interval(secs => %(steps)s - g)
      FROM generate_series(0, %(steps)s) AS g
)
INSERT INTO onward.step_attempts (run_id, lease_epoch, seq, attempt, step, worker,
                                  started_at, ended_at, outcome)
SELECT (SELECT id FROM run), g, g - 1, 1, 'loop', 'bench-worker:' || (g %% 4),
       onward.now() - make_interval(secs => %(steps)s - g),
       onward.now() - make_interval(secs => %(steps)s - g) + interval '12 milliseconds',
       'committed'
  FROM generate_series(1, %(steps)s) AS g
