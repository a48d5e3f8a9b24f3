-- Jobs whose lease expired, but those in $1 (rows the database refused to rescue), oldest first,
-- with what the leader needs to decide their next status (see jobs_rescue.sql).
SELECT id, attempts, claimed_at, type, retry_count, max_retries
FROM {schema}.jobs
WHERE status = 'running' AND lease_expires_at < now() AND NOT (id = ANY($1::bigint[]))
ORDER BY lease_expires_at
LIMIT 1000
