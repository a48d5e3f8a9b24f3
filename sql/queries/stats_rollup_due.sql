-- The minutes the maintenance leader rolls up next (stats_rollup.sql), at most $4: first those
-- not rolled up yet, newest first, from the last closed minute back to $3 seconds ago (the
-- longest chart); then, oldest first, those rolled up while some of their attempts were still
-- running (again at most once a minute), and those rolled up less than $2 seconds after they
-- ended, once that is past (a job enqueued in a transaction that began in the minute and
-- committed after its first rollup). A minute is closed $1 seconds after its end: an attempt's
-- started_at and a job's created_at are their transaction's start, committed a little later.
-- Reads the primary key of stats_rollup over the minutes of $3 seconds, whatever the traffic.
WITH bounds AS (
    SELECT date_bin(interval '1 minute', now() - make_interval(secs => 60 + $1::float8),
                    'epoch') AS last,
           date_bin(interval '1 minute', now() - make_interval(secs => $3::float8), 'epoch')
               AS first
), missing AS (
    SELECT m.minute
    FROM bounds AS b
    CROSS JOIN LATERAL generate_series(b.last, b.first, interval '-1 minute') AS m(minute)
    WHERE NOT EXISTS (SELECT FROM {schema}.stats_rollup AS r WHERE r.minute = m.minute)
    ORDER BY m.minute DESC
    LIMIT $4
), again AS (
    SELECT r.minute
    FROM {schema}.stats_rollup AS r
    CROSS JOIN bounds AS b
    WHERE r.minute >= b.first AND r.minute <= b.last
      AND ((r.running > 0 AND r.rolled_at < now() - interval '1 minute')
           OR (r.rolled_at < r.minute + make_interval(secs => 60 + $2::float8)
               AND r.minute + make_interval(secs => 60 + $2::float8) <= now()))
    ORDER BY r.minute
    LIMIT $4
)
SELECT minute
FROM (SELECT minute, 0 AS pass FROM missing UNION ALL SELECT minute, 1 FROM again) AS d
ORDER BY pass, minute DESC
LIMIT $4
