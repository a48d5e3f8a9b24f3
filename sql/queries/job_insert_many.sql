-- Many jobs in one statement, from one JSON array ($1) of {t: type, q: queue, p: payload,
-- pr: priority, m: max_retries, k: idempotency_key, c: correlation_id, r: run_at, d: delay,
-- v: version, ck: concurrency_key}; $2 is the traceparent of the span active at enqueue (NULL:
-- none), the same for every row.
-- Ids are drawn before the insert so that each input row (`ord`) maps to its job; rows whose
-- idempotency key already exists are not inserted and not returned.
WITH input AS MATERIALIZED (
    SELECT nextval(pg_get_serial_sequence('{schema}.jobs', 'id')) AS id, u.*
    FROM ROWS FROM (
        jsonb_to_recordset($1::jsonb)
            AS (t text, q text, p jsonb, pr integer, m integer, k text, c text,
                r timestamptz, d float8, v integer, ck text)
    ) WITH ORDINALITY AS u(type, queue, payload, priority, max_retries, idempotency_key,
                           correlation_id, run_at, delay, version, concurrency_key, ord)
), ins AS (
    INSERT INTO {schema}.jobs AS j (id, type, queue, payload, priority, max_retries,
                                    idempotency_key, fingerprint, correlation_id, run_at,
                                    version, traceparent, concurrency_key)
    OVERRIDING SYSTEM VALUE
    SELECT id, type, queue, coalesce(payload, 'null'), priority, max_retries, idempotency_key,
           CASE WHEN idempotency_key IS NOT NULL
                THEN {schema}.fingerprint(type, coalesce(payload, 'null')) END,
           coalesce(correlation_id, gen_random_uuid()::text),
           coalesce(run_at, now() + make_interval(secs => coalesce(delay, 0))),
           coalesce(version, 1), $2::text, concurrency_key
    FROM input
    ORDER BY ord
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING j.id, j.correlation_id, j.run_at, j.created_at
)
SELECT input.ord, ins.id, ins.correlation_id, ins.run_at, ins.created_at
FROM input JOIN ins ON ins.id = input.id
