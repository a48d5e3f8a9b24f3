-- The next batch of a bulk action: the ids of the jobs matching its filter ($1-$11,
-- _job_filter.sql) above the cursor $12 and at most its bound $13, lowest first, at most $14.
SELECT j.id
FROM {schema}.jobs AS j
WHERE {job_filter}
  AND j.id > $12::bigint AND j.id <= $13::bigint
ORDER BY j.id
LIMIT $14
