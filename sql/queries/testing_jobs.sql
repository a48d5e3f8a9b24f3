-- pgworker.testing: the jobs matching every filter given (NULL: any), oldest first: type $1,
-- queue $2, one of the statuses $3, a payload equal to $4 (jsonb equality: key order and
-- whitespace do not matter) or containing $5 (jsonb @>), idempotency key $6, correlation id $7,
-- priority $8.
SELECT {job_columns}
FROM {schema}.jobs AS j
WHERE ($1::text IS NULL OR j.type = $1)
  AND ($2::text IS NULL OR j.queue = $2)
  AND ($3::text[] IS NULL OR j.status = ANY($3::text[]))
  AND ($4::jsonb IS NULL OR j.payload = $4::jsonb)
  AND ($5::jsonb IS NULL OR j.payload @> $5::jsonb)
  AND ($6::text IS NULL OR j.idempotency_key = $6)
  AND ($7::text IS NULL OR j.correlation_id = $7)
  AND ($8::integer IS NULL OR j.priority = $8)
ORDER BY j.id
