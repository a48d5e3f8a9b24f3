-- The controls of every queue that has a row, by name (a NULL paused_at: not paused; a NULL
-- limit: no limit). Counts nothing: for pages that count the jobs already (GET /queues, the
-- dashboard's queues page).
-- Times are kept within what Python's datetime holds (years 1 to 9999): a row written by hand
-- may hold 'infinity', '-infinity' or a year BC, which asyncpg cannot give as an aware
-- datetime (the CLI, the dashboard and the HTTP API would fail on the whole list).
SELECT c.name,
       CASE WHEN c.paused_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'::timestamptz
            WHEN c.paused_at > '9999-12-31 23:59:59.999999+00'
            THEN '9999-12-31 23:59:59.999999+00'::timestamptz ELSE c.paused_at END AS paused_at,
       c.paused_by, c.pause_reason, c.max_running, c.rate_limit, c.rate_period
FROM {schema}.queues AS c
ORDER BY c.name
