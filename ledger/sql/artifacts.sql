-- Artifacts (ledger/artifact_sweep.py): which content-addressed bodies nothing references
-- any more, and the per-artifact advisory lock that orders their deletion against a new
-- reference. The lock is (%(lock)s, hashtext(sha256)): a writer that stores or copies a
-- reference holds it shared to its commit; a sweep try-locks it exclusively before its
-- check and skips an artifact it cannot lock (someone is referencing it right now).


-- name: artifacts_of_run
-- The artifacts run_id references: its evidence's bodies stored apart and kept requests,
-- and its checkpoints' states stored apart.
SELECT a.sha256 FROM onward.artifacts a
 WHERE a.sha256 IN (SELECT v.artifact_sha256 FROM onward.evidence v WHERE v.run_id = %(run_id)s
                    UNION SELECT v.request_hash FROM onward.evidence v WHERE v.run_id = %(run_id)s
                    UNION SELECT c.state -> '$artifact' ->> 'sha256' FROM onward.checkpoints c
                           WHERE c.run_id = %(run_id)s AND c.state ? '$artifact')
 ORDER BY a.sha256

-- name: artifacts_may_delete
-- Whether this role sees every tenant's references, and so may delete artifacts: the
-- operator (or a member of it), a superuser, a role with BYPASSRLS. onward_app and the
-- tables' owner (row-level security is forced) have no policy that lets them.
SELECT pg_has_role('onward_operator', 'USAGE')
       OR (SELECT r.rolsuper OR r.rolbypassrls FROM pg_catalog.pg_roles r
            WHERE r.rolname = current_user)

-- name: artifacts_lock
-- Try to take each artifact's lock exclusively (never waits: a writer holding it shared
-- keeps its artifact); the ones taken.
SELECT s AS sha256 FROM unnest(CAST(%(shas)s AS text[])) s
 WHERE pg_try_advisory_xact_lock(%(lock)s, hashtext(s))
 ORDER BY s

-- name: artifacts_share
-- Taken by a writer outside the hot statements (a branch or replay copying a state stored
-- apart, a corpus import, opened replays) before it writes its references: held to commit.
SELECT count(*) FROM (SELECT pg_advisory_xact_lock_shared(%(lock)s, hashtext(s))
                        FROM unnest(CAST(%(shas)s AS text[])) s ORDER BY s) t

-- name: artifacts_release
-- Delete those of the given (locked) artifacts nothing references now: no checkpoint state,
-- no evidence body, no request of evidence that is not compacted (a compacted answer's
-- request is not read again); their sizes.
DELETE FROM onward.artifacts a
 WHERE a.sha256 = ANY(CAST(%(shas)s AS text[]))
   AND NOT EXISTS (SELECT 1 FROM onward.checkpoints c
                    WHERE c.state ? '$artifact' AND (c.state -> '$artifact' ->> 'sha256') = a.sha256)
   AND NOT EXISTS (SELECT 1 FROM onward.evidence v WHERE v.artifact_sha256 = a.sha256)
   AND NOT EXISTS (SELECT 1 FROM onward.evidence v
                    WHERE v.request_hash = a.sha256
                      AND (v.artifact_sha256 IS NOT NULL OR NOT v.response ? '$compacted'))
RETURNING a.sha256, a.size

-- name: artifacts_unreferenced
-- A page of artifacts after sha `after` (NULL: from the start), by sha256, saying which
-- nothing references now, with their sizes (the sweep deletes those, locked, in
-- artifacts_release).
SELECT a.sha256, a.size,
       NOT EXISTS (SELECT 1 FROM onward.checkpoints c
                    WHERE c.state ? '$artifact' AND (c.state -> '$artifact' ->> 'sha256') = a.sha256)
   AND NOT EXISTS (SELECT 1 FROM onward.evidence v WHERE v.artifact_sha256 = a.sha256)
   AND NOT EXISTS (SELECT 1 FROM onward.evidence v
                    WHERE v.request_hash = a.sha256
                      AND (v.artifact_sha256 IS NOT NULL OR NOT v.response ? '$compacted')) AS free
  FROM onward.artifacts a
 WHERE CAST(%(after)s AS text) IS NULL OR a.sha256 > CAST(%(after)s AS text)
 ORDER BY a.sha256
 LIMIT %(limit)s

-- name: artifacts_freed_by
-- How many artifacts (and their bytes) nothing would reference once the given runs' states
-- and evidence are compacted, those unreferenced now included: one statement over sets (the
-- runs are hashed once, and the planner may anti-join every reference at once). Paging
-- through the artifacts comparing each reference with the run id arrays cost artifacts x
-- due runs: 3 to 7 s for 2,000 due runs and 17,550 artifacts, 0.03 to 0.08 s this way.
WITH states_runs AS MATERIALIZED (
    SELECT DISTINCT s AS run_id FROM unnest(CAST(%(states_runs)s AS uuid[])) s
), evidence_runs AS MATERIALIZED (
    SELECT DISTINCT s AS run_id FROM unnest(CAST(%(evidence_runs)s AS uuid[])) s
)
SELECT count(*) AS artifacts, coalesce(sum(a.size), 0) AS bytes
  FROM onward.artifacts a
 WHERE NOT EXISTS (SELECT 1 FROM onward.checkpoints c
                    WHERE c.state ? '$artifact' AND (c.state -> '$artifact' ->> 'sha256') = a.sha256
                      AND NOT EXISTS (SELECT 1 FROM states_runs d WHERE d.run_id = c.run_id))
   AND NOT EXISTS (SELECT 1 FROM onward.evidence v WHERE v.artifact_sha256 = a.sha256
                      AND NOT EXISTS (SELECT 1 FROM evidence_runs d WHERE d.run_id = v.run_id))
   AND NOT EXISTS (SELECT 1 FROM onward.evidence v
                    WHERE v.request_hash = a.sha256
                      AND (v.artifact_sha256 IS NOT NULL OR NOT v.response ? '$compacted')
                      AND NOT EXISTS (SELECT 1 FROM evidence_runs d WHERE d.run_id = v.run_id))
