-- The failures of the jobs still being retried, grouped as jobs_failure_groups.sql groups the
-- failed ones: the attempts that started at or after $1 and ended with an error (retried, lost,
-- timed out: read along job_attempts_started_idx) of the jobs pending or running now, of queue
-- $2 and of the types starting with $3 (NULL: any), by their error's group (migration 30); each
-- group's fingerprint, job type, error class, how many attempts, the first and last time one
-- ended, the newest one's error as a sample, and its attempts per hour of the last 24 hours.
-- The largest groups first, at most $4.
WITH f AS MATERIALIZED (
    SELECT a.id, a.error_group, a.type, a.finished_at,
           floor(date_part('epoch', a.finished_at - (now() - interval '24 hours')) / 3600)::int
               AS hour
    FROM {schema}.job_attempts AS a
    JOIN {schema}.jobs AS j ON j.id = a.job_id
    WHERE a.started_at >= $1::timestamptz AND a.error_group IS NOT NULL
      AND a.finished_at IS NOT NULL AND j.status IN ('pending', 'running')
      AND ($2::text IS NULL OR a.queue = $2::text)
      AND ($3::text IS NULL OR starts_with(a.type, $3::text))
), g AS (
    SELECT f.error_group, count(*) AS count, min(f.finished_at) AS first_seen,
           max(f.finished_at) AS last_seen, max(f.id) AS last_id
    FROM f
    GROUP BY f.error_group
    ORDER BY count(*) DESC, f.error_group
    LIMIT $4
), h AS (
    SELECT f.error_group, f.hour, count(*) AS n
    FROM f JOIN g ON g.error_group = f.error_group
    WHERE f.hour BETWEEN 0 AND 23
    GROUP BY f.error_group, f.hour
)
SELECT g.error_group AS fingerprint, s.type, s.error_type AS error_class, g.count, g.first_seen,
       g.last_seen,
       left(s.error_type || coalesce(': ' || nullif(s.error_message, ''), ''), 500) AS sample,
       ARRAY(SELECT coalesce(h.n, 0)::int FROM generate_series(0, 23) AS b(hour)
             LEFT JOIN h ON h.error_group = g.error_group AND h.hour = b.hour
             ORDER BY b.hour) AS trend
FROM g
JOIN {schema}.job_attempts AS s ON s.id = g.last_id
ORDER BY g.count DESC, g.error_group
