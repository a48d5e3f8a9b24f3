-- What to monitor: psql -f examples/recipes/monitor.sql (the default schema, pgworker).

-- Backlog and age per queue (also: pgworker status).
SELECT queue, count(*), max(now() - run_at) AS oldest
FROM pgworker.jobs WHERE status = 'pending' AND run_at <= now() GROUP BY queue;

-- Failure rate per type over the last hour.
SELECT type, count(*) FILTER (WHERE outcome IN ('failed', 'timed_out', 'retried')) AS bad,
       count(*) AS attempts
FROM pgworker.job_attempts WHERE started_at > now() - interval '1 hour' GROUP BY type;

-- Slowest job types (p95) over the last hour.
SELECT type, percentile_cont(0.95) WITHIN GROUP (ORDER BY finished_at - started_at) AS p95
FROM pgworker.job_attempts
WHERE started_at > now() - interval '1 hour' AND finished_at IS NOT NULL GROUP BY type;
