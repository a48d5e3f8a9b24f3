-- Many jobs in one statement. Ids are drawn before the insert so that each input row (`ord`)
-- maps to its job; rows whose idempotency key already exists are not inserted and not returned.
WITH input AS MATERIALIZED (
    SELECT nextval(pg_get_serial_sequence('{schema}.jobs', 'id')) AS id, u.*
    FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::integer[], $6::text[],
                $7::text[], $8::timestamptz[], $9::float8[])
         WITH ORDINALITY AS u(type, queue, payload, priority, max_retries, idempotency_key,
                              correlation_id, run_at, delay, ord)
), ins AS (
    INSERT INTO {schema}.jobs AS j (id, type, queue, payload, priority, max_retries,
                                    idempotency_key, fingerprint, correlation_id, run_at)
    OVERRIDING SYSTEM VALUE
    SELECT id, type, queue, payload::jsonb, priority, max_retries, idempotency_key,
           CASE WHEN idempotency_key IS NOT NULL THEN md5(type || chr(31) || payload::jsonb::text) END,
           correlation_id, coalesce(run_at, now() + make_interval(secs => coalesce(delay, 0)))
    FROM input
    ORDER BY ord
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING j.id, j.run_at, j.created_at
)
SELECT input.ord, ins.id, ins.run_at, ins.created_at
FROM input JOIN ins ON ins.id = input.id
