-- The end every claim shares (job_claim.sql, job_claim_wide.sql, job_claim_limited.sql,
-- http_job_claim.sql): the jobs its CTE `next` chose become running under this claim, as its
-- one-row CTE `claim` says (worker_id, lease in seconds, code_version, the claim's time `at`,
-- and the task's max_retries for each of `types`, for jobs enqueued without one), each with
-- its attempt row. `claim` is NOT MATERIALIZED and has no FROM: the planner folds its values
-- into these statements, as if written here.
claimed AS (
    UPDATE {schema}.jobs AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        max_retries = coalesce(j.max_retries,
                               (SELECT d.max_retries
                                FROM unnest(c.types, c.max_retries) AS d(type, max_retries)
                                WHERE d.type = j.type)),
        claimed_at = c.at,
        worker_id = c.worker_id,
        lease_expires_at = c.at + make_interval(secs => c.lease),
        heartbeat_at = c.at,
        budget_started_at = coalesce(j.budget_started_at, c.at),
        updated_at = c.at
    FROM claim AS c
    -- = ANY(array), not a join: an index scan even in a generic plan that cannot know the limit.
    WHERE j.id = ANY(ARRAY(SELECT n.id FROM next AS n))
    RETURNING {job_columns}
), opened AS (
    -- started_at is the claim's time: outcome checks match an attempt row by it.
    INSERT INTO {schema}.job_attempts (job_id, attempt, type, queue, worker_id, correlation_id,
                                       code_version, started_at, wait_ms)
    SELECT r.id, r.attempts, r.type, r.queue, c.worker_id, r.correlation_id, c.code_version,
           r.claimed_at,
           -- the wait: how long past its run_at the job waited for this claim
           greatest(extract(epoch FROM r.claimed_at - r.run_at) * 1000, 0)::real
    FROM claimed AS r, claim AS c
)
