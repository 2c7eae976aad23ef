-- Evidence (ledger/evidence.py): model answers and reads, recorded once and replayed.

-- fragment: evidence_of_command
-- The evidence command_id of run_id recorded, with its body if stored as an artifact.
SELECT e.*, a.body AS artifact_body,
       (SELECT r.tenant_id FROM onward.runs r WHERE r.id = e.run_id) AS tenant_id
  FROM onward.evidence e
  LEFT JOIN onward.artifacts a ON a.sha256 = e.artifact_sha256
 WHERE e.run_id = %(run_id)s AND e.command_id = %(command_id)s

-- name: find_evidence
-- The evidence a command recorded, with its body if stored as an artifact.
{evidence_of_command}

-- name: find_evidence_or_cover_call
-- find_evidence, before a call: with no recorded answer, the call is
-- about to be made, so the same statement extends the caller's live lease over the call's
-- time limit (and a margin), like an effect's attempt (ledger/effects.py): a model call or
-- read never outlives its lease. Fenced on that lease (``covered_until`` NULL: lost, or a
-- cancel was requested). A standing refusal of an earlier answer to the command (an answer
-- paid for that could not be recorded: debit_unrecorded_answer) is returned as ``refused_*``
-- and covers nothing: the call is not made again.
WITH found AS (
    {evidence_of_command}
), refused AS (
    SELECT x.kind, x.source, x.reason, x.answer_sha256, x.answer_bytes,
           x.input_tokens + x.output_tokens AS tokens, x.cost_usd, x.seq, x.request_hash,
           x.input_tokens, x.output_tokens, x.lease_epoch, x.mac
      FROM onward.refused_answers x
     WHERE x.run_id = %(run_id)s AND x.command_id = %(command_id)s AND x.cleared_at IS NULL
), cover AS (
    UPDATE onward.runs
       SET lease_expires_at = greatest(lease_expires_at,
                                       onward.now() + %(cover_s)s * interval '1 second')
     WHERE id = %(run_id)s AND lease_epoch = %(epoch)s AND status = 'running'
       AND lease_expires_at > onward.now() AND cancel_requested IS NULL
       AND NOT EXISTS (SELECT 1 FROM found) AND NOT EXISTS (SELECT 1 FROM refused)
    RETURNING lease_expires_at
)
SELECT r.cancel_requested IS NOT NULL AS cancelling,
       (SELECT lease_expires_at FROM cover) AS covered_until,
       x.kind AS refused_kind, x.source AS refused_source, x.reason AS refused_reason, x.answer_sha256 AS refused_sha256,
       x.answer_bytes AS refused_bytes, x.tokens AS refused_tokens,
       x.cost_usd AS refused_cost_usd, x.seq AS refused_seq,
       x.request_hash AS refused_request_hash, x.input_tokens AS refused_input_tokens,
       x.output_tokens AS refused_output_tokens, x.lease_epoch AS refused_lease_epoch,
       x.mac AS refused_mac, f.*
  FROM onward.runs r LEFT JOIN found f ON true LEFT JOIN refused x ON true
 WHERE r.id = %(run_id)s

-- name: record_evidence
-- One statement: under the live lease (the run at this seq, this lease epoch, running),
-- insert the evidence and debit its spend from the run's budgets. A stale holder records
-- nothing and debits nothing (``held`` = 0); an answer another attempt already recorded
-- (``recorded`` NULL) is not debited twice. The request is kept either as the artifact its
-- hash names (``request_body``, no encryption keys) or sealed in the row (``request``).
WITH fence AS (
    SELECT id FROM onward.runs
     WHERE id = %(run_id)s AND seq = %(seq)s AND lease_epoch = %(epoch)s AND status = 'running'
       FOR UPDATE
), artifact AS (
    INSERT INTO onward.artifacts (sha256, size, media_type, body)
    SELECT %(sha)s, %(size)s, 'application/json', %(body)s FROM fence
     WHERE %(sha)s::text IS NOT NULL
       -- held shared to commit: a sweep deleting unreferenced artifacts skips this one
       -- (ledger/artifact_sweep.py)
       AND pg_advisory_xact_lock_shared(%(artifact_lock)s, hashtext(%(sha)s))::text = ''
    ON CONFLICT (sha256) DO NOTHING
), request_artifact AS (
    INSERT INTO onward.artifacts (sha256, size, media_type, body)
    SELECT %(request_hash)s, length(%(request_body)s::bytea), 'application/json',
           %(request_body)s::bytea FROM fence
     WHERE %(request_body)s::bytea IS NOT NULL
       -- a row that does not keep its request takes no lock: it needs no bytes, and the
       -- run that kept them is covered (ledger/artifact_sweep.py, "A request named, not kept")
       AND pg_advisory_xact_lock_shared(%(artifact_lock)s, hashtext(%(request_hash)s))::text = ''
    ON CONFLICT (sha256) DO NOTHING
), recorded AS (
    INSERT INTO onward.evidence (run_id, command_id, kind, seq, step, source, source_version,
                                 request_hash, response, artifact_sha256, input_tokens,
                                 output_tokens, cost_usd, lease_epoch, mac, request)
    SELECT id, %(command_id)s, %(kind)s, %(seq)s, %(step)s, %(source)s, %(source_version)s,
           %(request_hash)s, %(response)s, %(sha)s, %(input_tokens)s, %(output_tokens)s,
           %(cost_usd)s, %(epoch)s, %(mac)s, %(request)s
      FROM fence
    ON CONFLICT (run_id, command_id) DO NOTHING
    RETURNING run_id, response, input_tokens + output_tokens AS tokens, cost_usd, created_at
), debited AS (
    UPDATE onward.runs r
       SET used_tokens = r.used_tokens + d.tokens,
           used_cost_usd = r.used_cost_usd + d.cost_usd
      FROM recorded d WHERE r.id = d.run_id
    RETURNING r.id
)
SELECT (SELECT count(*) FROM fence) AS held, d.response, d.cost_usd, d.created_at,
       (SELECT count(*) FROM debited) AS debited
  FROM (SELECT 1) AS one LEFT JOIN recorded d ON true

-- name: debit_late_answer
-- Spend on an answer that arrived after the caller's lease was lost: the model was paid, so
-- the run's budgets count it, though the answer is never used (the current holder asks, or
-- asked, itself). Not fenced: the money was spent whoever holds the step now.
UPDATE onward.runs
   SET used_tokens = used_tokens + %(tokens)s, used_cost_usd = used_cost_usd + %(cost_usd)s::numeric
 WHERE id = %(run_id)s
RETURNING id

-- name: debit_unrecorded_answer
-- Spend on an answer that could not be recorded (refused as bad input): still spent. Under
-- the live lease, one statement debits it and records the refusal (the call, the answer's
-- sha256 and size, why; never its bytes), so a worker killed before the run is failed
-- leaves what its successor needs to fail the step again without calling (and paying) again.
-- The refusal is signed (mac, ledger/signed.py refused_answer): the successor acts on it only
-- if it verifies.
WITH debited AS (
    UPDATE onward.runs
       SET used_tokens = used_tokens + %(tokens)s,
           used_cost_usd = used_cost_usd + %(cost_usd)s::numeric
     WHERE id = %(run_id)s AND seq = %(seq)s AND lease_epoch = %(epoch)s AND status = 'running'
    RETURNING id
), refused AS (
    INSERT INTO onward.refused_answers (run_id, seq, command_id, kind, source, request_hash,
                                        answer_sha256, answer_bytes, reason, input_tokens,
                                        output_tokens, cost_usd, lease_epoch, mac)
    SELECT id, %(seq)s, %(command_id)s, %(kind)s, %(source)s, %(request_hash)s,
           %(answer_sha256)s, %(answer_bytes)s, %(reason)s, %(input_tokens)s,
           %(output_tokens)s, %(cost_usd)s::numeric, %(epoch)s, %(mac)s
      FROM debited
    ON CONFLICT (run_id, command_id) WHERE cleared_at IS NULL DO NOTHING
    RETURNING id
)
SELECT d.id, (SELECT count(*) FROM refused) AS refused FROM debited d
