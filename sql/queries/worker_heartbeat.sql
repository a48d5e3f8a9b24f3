-- Extend the leases of the attempts this worker runs ($1 ids, $2 attempts, $3 their claims' times)
-- for $4 seconds, in one statement. Returns the attempts still held, whether an operator asked
-- to cancel them, and whether their lease was extended. A row another session holds locked (an
-- operator, a user's transaction) is skipped rather than waited for, and still reported held (not
-- extended): the next heartbeat extends it. One probe of the primary key per attempt, whatever
-- the table held when the plan was made (see job_finish_many.sql).
WITH held AS MATERIALIZED (
    -- Planned on its own: joined to `free` below, its rows would be read in key order instead.
    SELECT j.id, j.attempts, j.cancel_requested_at IS NOT NULL AS cancel_requested
    FROM {schema}.jobs AS j
    JOIN unnest($1::bigint[], $2::integer[], $3::timestamptz[]) AS r(id, attempt, claimed_at)
      ON j.id = ANY(ARRAY[r.id]) AND j.status = 'running' AND j.attempts = r.attempt
     AND j.claimed_at = r.claimed_at
), free AS (
    -- Locked again with the fence, which is checked anew on a row changed meanwhile.
    SELECT j.id
    FROM {schema}.jobs AS j
    JOIN unnest($1::bigint[], $2::integer[], $3::timestamptz[]) AS r(id, attempt, claimed_at)
      ON j.id = ANY(ARRAY[r.id]) AND j.status = 'running' AND j.attempts = r.attempt
     AND j.claimed_at = r.claimed_at
    FOR UPDATE OF j SKIP LOCKED
), extended AS (
    UPDATE {schema}.jobs AS j
    SET lease_expires_at = now() + make_interval(secs => $4::float8), heartbeat_at = now()
    WHERE j.id = ANY(ARRAY(SELECT id FROM free))
)
SELECT h.id, h.attempts, h.cancel_requested, f.id IS NOT NULL AS extended
FROM held AS h
LEFT JOIN free AS f ON f.id = h.id
