-- Every queue that a job names or that has a controls row, by name: its pause (NULL columns:
-- not paused), its limits (NULL: no limit) and its pending and running jobs. It counts the whole
-- of jobs, as status_counts.
-- Times are kept within what Python's datetime holds (years 1 to 9999): a row written by hand
-- may hold 'infinity', '-infinity' or a year BC, which asyncpg cannot give as an aware
-- datetime (the CLI, the dashboard and the HTTP API would fail on the whole list).
WITH counts AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'running') AS running
    FROM {schema}.jobs
    GROUP BY queue
)
SELECT coalesce(c.name, n.queue) AS name,
       CASE WHEN c.paused_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'::timestamptz
            WHEN c.paused_at > '9999-12-31 23:59:59.999999+00'
            THEN '9999-12-31 23:59:59.999999+00'::timestamptz ELSE c.paused_at END AS paused_at,
       c.paused_by, c.pause_reason, c.max_running, c.rate_limit, c.rate_period,
       coalesce(n.pending, 0) AS pending, coalesce(n.running, 0) AS running
FROM counts AS n
FULL JOIN {schema}.queues AS c ON c.name = n.queue
ORDER BY 1
