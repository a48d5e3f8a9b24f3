-- Claim up to $3 due jobs of the worker's queues ($1) whose (type, version) the worker serves,
-- highest priority first, then oldest run_at, then id: version 1 of the types in $9, and the other
-- versions listed in $10 as `type@version` (registry.served_key; empty when the worker serves
-- version 1 only, the common case, which then costs one integer comparison per row). Each claimed
-- job gets an attempt row, and the task's max_retries ($6, aligned with the types $2) where the
-- enqueuer gave none. The rows are whole jobs as the claim left them. With $8 = 'off' the claim
-- commits without waiting for its WAL flush (see the README, "Fast claims"); with NULL it commits
-- as the server is configured.
WITH next AS MATERIALIZED (
    -- One index scan of jobs_claim_idx per queue, each already in claim order.
    SELECT c.id
    FROM unnest($1::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at
        FROM {schema}.jobs
        WHERE status = 'pending' AND queue = q.name
          AND CASE WHEN version = 1 THEN type = ANY($9::text[])
                   ELSE type || '@' || version = ANY($10::text[]) END
          AND run_at <= now()
        ORDER BY priority DESC, run_at, id
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT $3
), claimed AS (
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
                                       code_version, started_at)
    SELECT id, attempts, type, queue, $4, correlation_id, $7, claimed_at FROM claimed
)
SELECT *
FROM claimed
WHERE (SELECT set_config('synchronous_commit',
                         coalesce($8::text, current_setting('synchronous_commit')), true))
      IS NOT NULL
ORDER BY priority DESC, run_at, id
