-- Every schedule's row (pgworker periodic list, the dashboard, GET /periodic), by name, with the
-- job of its last enqueued slot, found by its idempotency key (NULL once pruned).
SELECT p.name, p.type, p.schedule, p.last_slot, p.next_slot, p.checked_at, p.created_at,
       p.updated_at, j.id AS last_job_id, j.status AS last_job_status
FROM {schema}.periodic AS p
LEFT JOIN {schema}.jobs AS j ON j.idempotency_key = p.last_key
ORDER BY p.name
LIMIT $1
