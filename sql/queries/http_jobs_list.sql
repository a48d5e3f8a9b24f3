-- One page of jobs, newest id first, after the keyset `before` ($13: ids below it; NULL: from the
-- newest), matching the filter of the job lists ($1-$12, _job_filter.sql), at most $14 rows.
SELECT {job_columns}
FROM {schema}.jobs AS j
WHERE {job_filter}
  AND ($13::bigint IS NULL OR j.id < $13::bigint)
ORDER BY j.id DESC
LIMIT $14
