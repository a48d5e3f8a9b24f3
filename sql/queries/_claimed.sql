-- The end of the plain claims (job_claim.sql, job_claim_wide.sql), the same parameters: the
-- jobs their CTE `next` chose become running under this claim, each with its attempt row, and
-- come back whole, in claim order.
claimed AS (
    UPDATE {schema}.jobs AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        max_retries = coalesce(j.max_retries,
                               (SELECT d.max_retries
                                FROM unnest($2::text[], $6::integer[]) AS d(type, max_retries)
                                WHERE d.type = j.type)),
        claimed_at = now(),
        worker_id = $4,
        lease_expires_at = now() + make_interval(secs => $5::float8),
        heartbeat_at = now(),
        budget_started_at = coalesce(j.budget_started_at, now()),
        updated_at = now()
    -- = ANY(array), not a join: an index scan even in a generic plan that cannot know the limit.
    WHERE j.id = ANY(ARRAY(SELECT id FROM next))
    RETURNING {job_columns}
), opened AS (
    -- started_at is the claim's time: outcome checks match an attempt row by it.
    INSERT INTO {schema}.job_attempts (job_id, attempt, type, queue, worker_id, correlation_id,
                                       code_version, started_at, wait_ms)
    SELECT id, attempts, type, queue, $4, correlation_id, $7, claimed_at,
           -- the wait: how long past its run_at the job waited for this claim (migration 23)
           greatest(extract(epoch FROM claimed_at - run_at) * 1000, 0)::real FROM claimed
)
SELECT *
FROM claimed
WHERE (SELECT set_config('synchronous_commit',
                         coalesce($8::text, current_setting('synchronous_commit')), true))
      IS NOT NULL
ORDER BY priority DESC, run_at, id
