-- Find failures: psql -f examples/recipes/find_failures.sql (the default schema, pgworker).

-- Jobs that failed for good in the last day, newest first, with their last error.
SELECT id, type, queue, attempts, finished_at, error
FROM pgworker.jobs
WHERE status = 'failed' AND finished_at > now() - interval '1 day'
ORDER BY finished_at DESC
LIMIT 100;

-- The errors of the last day per type, retried ones included, most frequent first.
SELECT type, outcome, error_type, count(*) AS attempts, max(started_at) AS last_seen,
       min(error_message) AS example
FROM pgworker.job_attempts
WHERE started_at > now() - interval '1 day' AND outcome NOT IN ('running', 'completed')
GROUP BY type, outcome, error_type
ORDER BY attempts DESC;

-- Every attempt of one job (here job 42), in order: who ran it, how it ended, and why.
SELECT attempt, outcome, worker_id, started_at, finished_at, error_type, error_message
FROM pgworker.job_attempts
WHERE job_id = 42
ORDER BY attempt;
