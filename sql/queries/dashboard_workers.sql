-- The dashboard's workers (the worker_activity view): when each was last seen, in seconds, its
-- lease (NULL: a worker of an earlier version), whether it claims over HTTP, and the ids of the
-- jobs it runs; those seen within $2 seconds (the page's retention), at most $1.
SELECT w.worker_id, w.hostname, w.pid, w.queues, w.types, w.concurrency, w.started_at,
       w.last_seen_at, extract(epoch FROM w.seen_ago)::float8 AS seen_ago,
       w.running_job_ids, k.lease, k.http
FROM {schema}.worker_activity AS w
JOIN {schema}.workers AS k ON k.worker_id = w.worker_id
WHERE w.last_seen_at > now() - make_interval(secs => $2::float8)
ORDER BY w.last_seen_at DESC, w.worker_id
LIMIT $1
