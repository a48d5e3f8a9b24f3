-- Extend the leases of the attempts this worker runs ($1 ids, $2 attempts, $3 their claims' times)
-- in one statement. Returns the attempts still held, and whether an operator asked to cancel them.
UPDATE {schema}.jobs AS j
SET lease_expires_at = now() + make_interval(secs => $4::float8), heartbeat_at = now()
FROM unnest($1::bigint[], $2::integer[], $3::timestamptz[]) AS r(id, attempt, claimed_at)
WHERE j.id = r.id AND j.status = 'running' AND j.attempts = r.attempt
  AND j.claimed_at = r.claimed_at
RETURNING j.id, j.attempts, j.cancel_requested_at IS NOT NULL AS cancel_requested
