-- Claim up to $3 due jobs of the worker's queues ($1) and types ($2) in one statement, open an
-- attempt row for each, and write the task's max_retries ($6, aligned with $2) where the
-- enqueuer gave none.
WITH next AS MATERIALIZED (
    -- One index scan of jobs_claim_idx per queue, each already in claim order.
    SELECT c.id
    FROM unnest($1::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at
        FROM {schema}.jobs
        WHERE status = 'pending' AND queue = q.name AND type = ANY($2::text[])
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
        updated_at = now()
    FROM next
    WHERE j.id = next.id
    RETURNING {job_columns}
), opened AS (
    INSERT INTO {schema}.job_attempts (job_id, attempt, type, queue, worker_id, correlation_id,
                                       code_version)
    SELECT id, attempts, type, queue, $4, correlation_id, $7 FROM claimed
)
SELECT * FROM claimed ORDER BY priority DESC, run_at, id
