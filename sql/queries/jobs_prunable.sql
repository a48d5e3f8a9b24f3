-- What jobs_prune.sql would delete ($1 statuses and $2 ages in seconds, aligned), counted per
-- status: a dry run.
WITH rules AS (
    SELECT r.status, now() - make_interval(secs => r.age) AS before
    FROM unnest($1::text[], $2::float8[]) AS r(status, age)
)
SELECT j.status, count(*) AS jobs
FROM {schema}.jobs AS j
WHERE j.finished_at IS NOT NULL
  AND j.finished_at < (SELECT max(before) FROM rules)
  AND j.status IN ('completed', 'failed', 'cancelled')
  AND j.finished_at < (SELECT r.before FROM rules AS r WHERE r.status = j.status)
GROUP BY j.status
