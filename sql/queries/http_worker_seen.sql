-- An HTTP worker ($1) was seen: listed in `workers` (and the worker_activity view) from its first
-- claim, its last_seen_at renewed by each request; what its first request said is kept.
INSERT INTO {schema}.workers (worker_id, hostname, pid, queues, types, concurrency)
VALUES ($1, $2, 0, coalesce($3::text[], '{}'), coalesce($4::text[], '{}'), 1)
ON CONFLICT (worker_id) DO UPDATE SET last_seen_at = now()
