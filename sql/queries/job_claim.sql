-- Write the outcomes of the attempts that just ended ($1-$9, see _job_finish.sql) and claim up to
-- $12 due jobs of the worker's queues ($10) and types ($11), in one statement and one commit.
-- Each claimed job gets an attempt row, and the task's max_retries ($15, aligned with $11) where
-- the enqueuer gave none. The first row is a header: `written`, the ids of the outcomes written,
-- and `now`, the claim's time; the claimed jobs follow, with only the columns the claim did not
-- set itself (the worker knows the others: running, its own id, claimed now, the lease).
WITH {job_finish},
next AS MATERIALIZED (
    -- One index scan of jobs_claim_idx per queue, each already in claim order.
    SELECT c.id
    FROM unnest($10::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at
        FROM {schema}.jobs
        WHERE status = 'pending' AND queue = q.name AND type = ANY($11::text[])
          AND run_at <= now()
        ORDER BY priority DESC, run_at, id
        LIMIT $12
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT $12
), claimed AS (
    UPDATE {schema}.jobs AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        max_retries = coalesce(j.max_retries,
                               (SELECT d.max_retries
                                FROM unnest($11::text[], $15::integer[]) AS d(type, max_retries)
                                WHERE d.type = j.type)),
        claimed_at = now(),
        worker_id = $13,
        lease_expires_at = now() + make_interval(secs => $14::float8),
        heartbeat_at = now(),
        updated_at = now()
    -- = ANY(array), not a join: an index scan even in a generic plan that cannot know the limit.
    WHERE j.id = ANY(ARRAY(SELECT id FROM next))
    RETURNING j.id, j.type, j.queue, j.payload, j.priority, j.retry_count, j.max_retries,
              j.attempts, j.idempotency_key, j.correlation_id, j.run_at, j.error, j.progress,
              j.created_at
), opened AS (
    INSERT INTO {schema}.job_attempts (job_id, attempt, type, queue, worker_id, correlation_id,
                                       code_version)
    SELECT id, attempts, type, queue, $13, correlation_id, $16 FROM claimed
)
SELECT (SELECT array_agg(id) FROM done) AS written, now() AS now, NULL::bigint AS id,
       NULL AS type, NULL AS queue, NULL AS payload, NULL::integer AS priority,
       NULL::integer AS retry_count, NULL::integer AS max_retries, NULL::integer AS attempts,
       NULL AS idempotency_key, NULL AS correlation_id, NULL::timestamptz AS run_at, NULL AS error,
       NULL AS progress, NULL::timestamptz AS created_at
UNION ALL
SELECT NULL, NULL, c.id, c.type, c.queue, c.payload::text, c.priority, c.retry_count,
       c.max_retries, c.attempts, c.idempotency_key, c.correlation_id, c.run_at, c.error,
       c.progress::text, c.created_at
FROM claimed AS c
ORDER BY priority DESC NULLS FIRST, run_at, id
