-- Jobs whose lease expired, but those in $1 (rows the database refused to rescue), in the order
-- of their leases from after ($2, $3) (the last job of the previous page, when that page was
-- full: so that a thousand jobs that cannot be rescued never hide the others), with
-- what the leader needs to decide their next status (see jobs_rescue.sql). A page of 250
-- (_maintenance.PAGE): each rescue statement holds the worker's shared connection briefly.
SELECT id, attempts, claimed_at, type, queue, retry_count, max_retries, lease_expires_at,
       extract(epoch FROM now() - budget_started_at)::float8 AS elapsed
FROM {schema}.jobs
WHERE status = 'running' AND lease_expires_at < now() AND NOT (id = ANY($1::bigint[]))
  AND lease_expires_at >= $2::timestamptz AND (lease_expires_at, id) > ($2::timestamptz, $3::bigint)
ORDER BY lease_expires_at, id
LIMIT 250
