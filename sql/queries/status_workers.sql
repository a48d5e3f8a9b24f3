SELECT worker_id, hostname, pid, queues, types, concurrency, started_at, last_seen_at
FROM {schema}.workers
WHERE last_seen_at > now() - make_interval(secs => $1::float8)
ORDER BY worker_id
