-- The workers seen within $1 seconds, and what they serve: the list idle workers take turns by
-- (pgworker/_runtime/turns.py, which orders it itself).
SELECT worker_id, queues, types
FROM {schema}.workers
WHERE last_seen_at > now() - make_interval(secs => $1::float8)
