-- The dashboard's workers (the worker_activity view): when each was last seen, in seconds, and
-- the ids of the jobs it runs; at most $1.
SELECT w.worker_id, w.hostname, w.pid, w.queues, w.types, w.concurrency, w.started_at,
       w.last_seen_at, extract(epoch FROM w.seen_ago)::float8 AS seen_ago,
       w.running_job_ids
FROM {schema}.worker_activity AS w
ORDER BY w.last_seen_at DESC, w.worker_id
LIMIT $1
