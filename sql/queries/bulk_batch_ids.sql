-- The next batch of a bulk action: the ids of the jobs matching its filter ($1-$12,
-- _job_filter.sql) above the cursor $13 and at most its bound $14, lowest first, at most $15.
SELECT j.id
FROM {schema}.jobs AS j
WHERE {job_filter}
  AND j.id > $13::bigint AND j.id <= $14::bigint
ORDER BY j.id
LIMIT $15
