-- Many jobs in one statement, in input order (`ord`). Ids are drawn before the insert so that each
-- input row maps to its job; rows whose idempotency key exists come back with created = false.
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
    RETURNING {job_columns}
)
SELECT input.ord, true AS created, true AS matches, ins.*
FROM input JOIN ins ON ins.id = input.id
UNION ALL
SELECT input.ord, false,
       j.fingerprint IS NOT DISTINCT FROM md5(input.type || chr(31) || input.payload::jsonb::text),
       {job_columns}
FROM input JOIN {schema}.jobs AS j ON j.idempotency_key = input.idempotency_key
WHERE NOT EXISTS (SELECT FROM ins WHERE ins.id = input.id)
ORDER BY ord
