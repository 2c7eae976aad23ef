-- The worker fleet (ledger/fleet.py): what each worker advertises, and who serves what.

-- name: advertise_queue
-- A worker's queue for one workflow version, with its start step and state schema.
INSERT INTO onward.worker_queues (queue, workflow, version, seen_at, start_step, state_schema)
VALUES (%(queue)s, %(workflow)s, %(version)s, onward.now(), %(start_step)s, %(state_schema)s)
ON CONFLICT (queue) DO UPDATE SET seen_at = onward.now(), start_step = EXCLUDED.start_step,
                                  state_schema = EXCLUDED.state_schema
RETURNING queue

-- name: advertise_worker
-- A worker's main process tells the ledger about itself (rows older than a day pruned).
WITH pruned AS (
    DELETE FROM onward.workers WHERE seen_at < onward.now() - interval '1 day'
)
INSERT INTO onward.workers (node, host, pid, pool, concurrency, queues, workflows, in_flight,
                            started_at, seen_at)
VALUES (%(node)s, %(host)s, %(pid)s, %(pool)s, %(concurrency)s, %(queues)s, %(workflows)s,
        %(in_flight)s, onward.now(), onward.now())
ON CONFLICT (node) DO UPDATE
   SET host = EXCLUDED.host, pid = EXCLUDED.pid, pool = EXCLUDED.pool,
       concurrency = EXCLUDED.concurrency, queues = EXCLUDED.queues,
       workflows = EXCLUDED.workflows, in_flight = EXCLUDED.in_flight,
       -- a new main process under the same node name is a restart
       started_at = CASE WHEN onward.workers.pid = EXCLUDED.pid
                         THEN onward.workers.started_at ELSE onward.now() END,
       seen_at = onward.now()
RETURNING node

-- name: retire_worker
-- A worker's main process leaves the fleet.
DELETE FROM onward.workers WHERE node = %(node)s AND pid = %(pid)s RETURNING node

-- name: workers
-- The fleet, live or not.
SELECT node, host, pid, pool, concurrency, queues, workflows, in_flight, started_at, seen_at,
       extract(epoch FROM onward.now() - seen_at)::float8 AS age_s,
       seen_at > onward.now() - %(within)s * interval '1 second' AS live
  FROM onward.workers ORDER BY host, node

-- name: unserved_runs
-- Active runs by workflow and version (the status index holds the few that are not
-- terminal), against what live workers advertise: a workflow no live worker has, or a
-- version no live worker has, is unserved.
WITH served AS (
    SELECT DISTINCT workflow, version FROM onward.worker_queues
     WHERE seen_at > onward.now() - %(within)s * interval '1 second'
), active AS (
    SELECT workflow, workflow_version, count(*) AS runs FROM onward.runs
     WHERE status IN ('running', 'waiting')
     GROUP BY workflow, workflow_version
)
SELECT a.workflow, a.workflow_version AS version, a.runs,
       EXISTS (SELECT 1 FROM served s WHERE s.workflow = a.workflow) AS workflow_served
  FROM active a
 WHERE NOT EXISTS (SELECT 1 FROM served s WHERE s.workflow = a.workflow
                     AND (a.workflow_version IS NULL OR s.version = a.workflow_version))
 ORDER BY a.workflow, a.workflow_version

-- name: advertised_workflows
-- Every workflow version some worker has ever advertised, with its state model's JSON
-- Schema (ledger/catalog.py).
SELECT workflow, version, state_schema FROM onward.worker_queues
