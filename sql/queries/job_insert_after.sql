-- One job with parents (enqueue(..., after=)): job_insert.sql's insert, with the parents $13
-- (ids in order), how many have not ended $14, what a failed parent does $15, and $16, the
-- error of a job cancelled at once because a parent already failed (NULL: not cancelled). A job
-- waiting for parents is parked (run_at 'infinity', see migration 19); one whose parents all
-- ended is due now. The parent -> child rows are written with it. An existing job holding the
-- idempotency key is returned instead, as by job_insert.sql, and nothing else is written.
WITH ins AS (
    INSERT INTO {schema}.jobs AS j (type, queue, payload, priority, max_retries, idempotency_key,
                                    fingerprint, correlation_id, run_at, version,
                                    traceparent, concurrency_key, parents, parents_left,
                                    on_parent_failure, status, finished_at, error)
    VALUES ($1, $2, $3::jsonb, $4, $5, $6::text,
            CASE WHEN $6::text IS NOT NULL THEN {schema}.fingerprint($1, $3::jsonb) END,
            coalesce($7, gen_random_uuid()::text),
            CASE WHEN $14::integer > 0 AND $16::text IS NULL THEN 'infinity'::timestamptz
                 ELSE coalesce($8::timestamptz,
                               now() + make_interval(secs => coalesce($9::float8, 0))) END,
            $10::integer, $11::text, $12::text, $13::bigint[], $14::integer, $15::text,
            CASE WHEN $16::text IS NULL THEN 'pending' ELSE 'cancelled' END,
            CASE WHEN $16::text IS NOT NULL THEN now() END,
            $16::text)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING {job_columns}
), linked AS (
    INSERT INTO {schema}.job_dependencies (parent_id, child_id)
    SELECT p.id, ins.id FROM ins CROSS JOIN unnest($13::bigint[]) AS p(id)
)
{inserted_or_held}
