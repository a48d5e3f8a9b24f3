-- The jobs holding idempotency keys ($1), each with whether it was created with the type ($2)
-- and payload ($3) given beside its key (JSON values, see same_work in migration 10).
SELECT k.key AS requested_key, false AS created,
       {schema}.same_work(j.type, j.payload, k.type, k.payload::jsonb) AS matches,
       {job_columns}
FROM unnest($1::text[], $2::text[], $3::text[]) AS k(key, type, payload)
JOIN {schema}.jobs AS j ON j.idempotency_key = k.key
