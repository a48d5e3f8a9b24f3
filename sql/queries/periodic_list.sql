-- Every schedule's row (pgworker periodic list, the dashboard, GET /periodic), by name, with the
-- job of its last enqueued slot, found by its idempotency key (NULL once pruned).
-- Times are kept within what Python's datetime holds (years 1 to 9999): a row written by hand
-- may hold 'infinity', '-infinity' or a year BC, which asyncpg cannot give as an aware
-- datetime (the CLI, the dashboard and the HTTP API would fail on the whole list).
SELECT p.name, p.type, p.schedule,
       CASE WHEN p.last_slot < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'::timestamptz
            WHEN p.last_slot > '9999-12-31 23:59:59.999999+00'
            THEN '9999-12-31 23:59:59.999999+00'::timestamptz ELSE p.last_slot END AS last_slot,
       CASE WHEN p.next_slot < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'::timestamptz
            WHEN p.next_slot > '9999-12-31 23:59:59.999999+00'
            THEN '9999-12-31 23:59:59.999999+00'::timestamptz ELSE p.next_slot END AS next_slot,
       CASE WHEN p.checked_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'::timestamptz
            WHEN p.checked_at > '9999-12-31 23:59:59.999999+00'
            THEN '9999-12-31 23:59:59.999999+00'::timestamptz ELSE p.checked_at END AS checked_at,
       j.id AS last_job_id, j.status AS last_job_status
FROM {schema}.periodic AS p
LEFT JOIN {schema}.jobs AS j ON j.idempotency_key = p.last_key
ORDER BY p.name
LIMIT $1
