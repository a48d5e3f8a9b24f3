-- Mark the worker alive and extend the leases of the attempts it runs ($2 ids, $3 attempts).
WITH seen AS (
    UPDATE {schema}.workers SET last_seen_at = now() WHERE worker_id = $1
)
UPDATE {schema}.jobs AS j
SET lease_expires_at = now() + make_interval(secs => $4::float8), heartbeat_at = now()
FROM unnest($2::bigint[], $3::integer[]) AS r(id, attempt)
WHERE j.id = r.id AND j.status = 'running' AND j.attempts = r.attempt
