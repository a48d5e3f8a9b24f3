-- One job; an existing row with the same idempotency key is returned instead (created = false),
-- with `matches` telling whether it was created with the same type and payload (JSON values,
-- see same_work in migration 10). $11 is the traceparent of the span active at enqueue (NULL:
-- none), $12 the concurrency key (NULL: none).
WITH ins AS (
    INSERT INTO {schema}.jobs AS j (type, queue, payload, priority, max_retries, idempotency_key,
                                    fingerprint, correlation_id, run_at, version,
                                    traceparent, concurrency_key)
    VALUES ($1, $2, $3::jsonb, $4, $5, $6::text,
            CASE WHEN $6::text IS NOT NULL THEN {schema}.fingerprint($1, $3::jsonb) END,
            coalesce($7, gen_random_uuid()::text),
            coalesce($8::timestamptz, now() + make_interval(secs => coalesce($9::float8, 0))),
            $10::integer, $11::text, $12::text)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING {job_columns}
)
{inserted_or_held}
