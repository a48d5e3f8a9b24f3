INSERT INTO {schema}.workers (worker_id, hostname, pid, queues, types, concurrency)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (worker_id) DO UPDATE
SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
    types = EXCLUDED.types, concurrency = EXCLUDED.concurrency, last_seen_at = now()
