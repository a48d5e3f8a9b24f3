INSERT INTO {schema}.workers (worker_id, hostname, pid, queues, types, concurrency, lease)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (worker_id) DO UPDATE
SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
    types = EXCLUDED.types, concurrency = EXCLUDED.concurrency, lease = EXCLUDED.lease,
    http = false, last_seen_at = now()
