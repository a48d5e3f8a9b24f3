-- One job with a unique key ($11), held in the states of mask $12 (see migration 17) and, with a
-- unique period of $13 seconds (NULL: none), in the period bucket of the transaction's time.
-- The unique index jobs_unique_idx decides: a live job already holding the key, type and queue
-- is returned instead (created = false). No row: the holder committed after this statement's
-- snapshot, or left its states in between: run it again. $10 is the traceparent.
WITH bucket AS (
    SELECT CASE WHEN $13::float8 IS NULL THEN '-infinity'::timestamptz
                ELSE to_timestamp(floor(extract(epoch FROM now())::float8 / $13::float8)
                                  * $13::float8) END AS start
), ins AS (
    INSERT INTO {schema}.jobs AS j (type, queue, payload, priority, max_retries, correlation_id,
                                    run_at, version, traceparent, concurrency_key, unique_key,
                                    unique_states, unique_bucket)
    SELECT $1, $2, $3::jsonb, $4, $5, coalesce($6, gen_random_uuid()::text),
           coalesce($7::timestamptz, now() + make_interval(secs => coalesce($8::float8, 0))),
           $9::integer, $10::text, $14::text, $11::text, $12::smallint, bucket.start
    FROM bucket
    ON CONFLICT (queue, type, unique_key, unique_bucket)
        WHERE unique_key IS NOT NULL AND {schema}.unique_state_in(unique_states, status)
        DO NOTHING
    RETURNING {job_columns}
)
SELECT true AS created, ins.* FROM ins
UNION ALL
SELECT false, {job_columns}
FROM {schema}.jobs AS j, bucket
WHERE NOT EXISTS (SELECT FROM ins)
  AND j.queue = $2 AND j.type = $1 AND j.unique_key = $11::text AND j.unique_bucket = bucket.start
  AND j.unique_key IS NOT NULL AND {schema}.unique_state_in(j.unique_states, j.status)
