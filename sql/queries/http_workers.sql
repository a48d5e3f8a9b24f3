-- The workers the leader has not forgotten, with the jobs each is running (worker_activity).
SELECT worker_id, hostname, pid, queues, types, concurrency, started_at, last_seen_at,
       extract(epoch FROM seen_ago)::float8 AS seen_ago_s, running_job_ids
FROM {schema}.worker_activity
ORDER BY worker_id
