-- The outbox and the dispatcher (ledger/outbox.py): messages due to be published.

-- name: due_messages
-- The outbox rows due to be published (or dropped: a stopped run's), locked for this
-- dispatcher.
SELECT o.id, o.run_id, o.seq, r.workflow, r.workflow_version, r.step, r.attempt, r.priority,
       coalesce(o.trace_context, r.trace_context) AS trace_context,
       (r.status <> 'running' OR o.seq < r.seq) AS dead
  FROM onward.outbox o JOIN onward.runs r ON r.id = o.run_id
 WHERE o.due_at <= onward.now()
   AND ((o.published_at IS NULL
         AND (NOT o.worker_publishes
              OR o.created_at < onward.now() - %(grace)s * interval '1 second'))
        -- a row published but not consumed is sent again, backing off exponentially (so
        -- a long queue under load is not flooded with copies of messages it still holds)
        -- up to republish_max: a lost message is re-sent within that bound
        OR o.published_at < onward.now()
                            - least(%(republish)s * power(2, greatest(o.publish_count - 1, 0)),
                                    %(republish_max)s) * interval '1 second'
        -- a stopped run's row (or one its run has moved past) is deleted, never published
        OR r.status <> 'running' OR o.seq < r.seq)
 ORDER BY o.due_at
 LIMIT %(limit)s
 FOR UPDATE OF o SKIP LOCKED

-- name: live_queues
-- The queues live workers advertise (seen within the last within seconds).
SELECT queue, workflow, version, start_step FROM onward.worker_queues
 WHERE seen_at > onward.now() - %(within)s * interval '1 second'

-- name: drop_messages
-- Delete outbox rows of stopped runs (or of a seq the run moved past).
DELETE FROM onward.outbox WHERE id = ANY(%(ids)s)

-- name: mark_published
-- Mark outbox rows published (the republish backoff counts them).
UPDATE onward.outbox SET published_at = onward.now(), publish_count = publish_count + 1
 WHERE id = ANY(%(ids)s)

-- name: next_due
-- Seconds until the next delayed row is due (NULL: none).
SELECT extract(epoch FROM min(due_at) - onward.now()) AS next_due_in FROM onward.outbox
 WHERE published_at IS NULL AND NOT worker_publishes AND due_at > onward.now()
