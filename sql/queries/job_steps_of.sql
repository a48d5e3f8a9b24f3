-- The steps job $1 has done, in the order they finished (for get_job and `pgworker show`).
SELECT name, result::text AS result, attempt, started_at, finished_at
FROM {schema}.job_steps
WHERE job_id = $1
ORDER BY finished_at, name
