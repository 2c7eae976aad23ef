-- Verification (ledger/verify.py): what a run's recorded history must not contain.


-- name: beyond_head
-- Work recorded past the run's head (a head moved back).
SELECT 'step attempt' AS what, seq, count(*) AS n FROM onward.step_attempts
 WHERE run_id = %(run)s AND (seq > %(seq)s OR (seq = %(seq)s AND outcome = 'committed')) GROUP BY seq
UNION ALL
SELECT 'evidence', seq, count(*) FROM onward.evidence WHERE run_id = %(run)s AND seq > %(seq)s
 GROUP BY seq
UNION ALL
SELECT 'effect', seq, count(*) FROM onward.effects WHERE run_id = %(run)s AND seq > %(seq)s
 GROUP BY seq
ORDER BY seq
