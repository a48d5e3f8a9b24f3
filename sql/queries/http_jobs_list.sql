-- One page of jobs, newest id first, after the keyset `before` ($5: ids below it; NULL: from the
-- newest), filtered by status, type, queue and correlation id (NULL: any), at most $6 rows.
SELECT {job_columns}
FROM {schema}.jobs AS j
WHERE ($1::text IS NULL OR j.status = $1::text)
  AND ($2::text IS NULL OR j.type = $2::text)
  AND ($3::text IS NULL OR j.queue = $3::text)
  AND ($4::text IS NULL OR j.correlation_id = $4::text)
  AND ($5::bigint IS NULL OR j.id < $5::bigint)
ORDER BY j.id DESC
LIMIT $6
