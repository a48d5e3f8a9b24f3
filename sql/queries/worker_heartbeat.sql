-- Extend the leases of the attempts this worker runs ($1 ids, $2 attempts) in one statement.
-- Returns the attempts still held, and whether an operator asked to cancel them.
UPDATE {schema}.jobs AS j
SET lease_expires_at = now() + make_interval(secs => $3::float8), heartbeat_at = now()
FROM unnest($1::bigint[], $2::integer[]) AS r(id, attempt)
WHERE j.id = r.id AND j.status = 'running' AND j.attempts = r.attempt
RETURNING j.id, j.cancel_requested_at IS NOT NULL AS cancel_requested
