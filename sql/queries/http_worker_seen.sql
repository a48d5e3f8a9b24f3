-- An HTTP worker ($1) was seen: listed in `workers` (and the worker_activity view) from its first
-- claim, its last_seen_at renewed by each request; what its first request said is kept, but for
-- its lease ($5, the lease of its last claim: NULL keeps the one known).
INSERT INTO {schema}.workers (worker_id, hostname, pid, queues, types, concurrency, lease, http)
VALUES ($1, $2, 0, coalesce($3::text[], '{}'), coalesce($4::text[], '{}'), 1, $5, true)
ON CONFLICT (worker_id) DO UPDATE
SET last_seen_at = now(), lease = coalesce(EXCLUDED.lease, {schema}.workers.lease)
