-- Anchors (ledger/anchoring.py): every run's head, written out and compared back.


-- name: database_now
-- The database's time (onward's one clock).
SELECT onward.now()

-- name: run_heads
-- Every run's head, in id order.
SELECT id, tenant_id, seq, head_hash, head_mac FROM onward.runs ORDER BY id

-- name: at_anchored_seq
-- Where each anchored run is now, and its checkpoint at the anchored seq. Two index lookups
-- per anchored run (scalar subqueries): as joins, the planner hashes the whole of runs and
-- checkpoints for every batch, which grows with the ledger, not the batch.
SELECT a.run_id,
       (SELECT r.seq FROM onward.runs r WHERE r.id = a.run_id) AS seq,
       (SELECT c.hash FROM onward.checkpoints c
         WHERE c.run_id = a.run_id AND c.seq = a.seq) AS hash
  FROM unnest(CAST(%(ids)s AS uuid[]), CAST(%(seqs)s AS integer[])) AS a(run_id, seq)
