-- One page of jobs, newest id first, after the keyset `before` ($12: ids below it; NULL: from the
-- newest), matching the filter of the job lists ($1-$11, _job_filter.sql), at most $13 rows.
SELECT {job_columns}
FROM {schema}.jobs AS j
WHERE {job_filter}
  AND ($12::bigint IS NULL OR j.id < $12::bigint)
ORDER BY j.id DESC
LIMIT $13
