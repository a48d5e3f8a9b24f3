-- The failures grouped as people think of them: the finished jobs matching the filter ($1-$12,
-- _job_filter.sql: the caller bounds the finish time, so that the range scan of
-- jobs_finished_idx reads only that window) by their latest error's group (migration 30): each
-- group's fingerprint, job type, error class, how many jobs, the first and last finish time, the
-- error of its newest job as a sample, and `trend`, its jobs per hour of the last 24 hours
-- (oldest first, the last one the hour up to now). The largest groups first, at most $13.
WITH f AS MATERIALIZED (
    SELECT j.id, j.error_group,
           floor(date_part('epoch', j.finished_at - (now() - interval '24 hours')) / 3600)::int
               AS hour,
           j.finished_at
    FROM {schema}.jobs AS j
    WHERE j.finished_at IS NOT NULL AND j.error_group IS NOT NULL AND {job_filter}
), g AS (
    SELECT f.error_group, count(*) AS count, min(f.finished_at) AS first_seen,
           max(f.finished_at) AS last_seen, max(f.id) AS last_id
    FROM f
    GROUP BY f.error_group
    ORDER BY count(*) DESC, f.error_group
    LIMIT $13
), h AS (
    SELECT f.error_group, f.hour, count(*) AS n
    FROM f JOIN g ON g.error_group = f.error_group
    WHERE f.hour BETWEEN 0 AND 23
    GROUP BY f.error_group, f.hour
)
SELECT g.error_group AS fingerprint, s.type, split_part(s.error, ': ', 1) AS error_class,
       g.count, g.first_seen, g.last_seen, left(split_part(s.error, E'\n', 1), 500) AS sample,
       ARRAY(SELECT coalesce(h.n, 0)::int FROM generate_series(0, 23) AS b(hour)
             LEFT JOIN h ON h.error_group = g.error_group AND h.hour = b.hour
             ORDER BY b.hour) AS trend
FROM g
JOIN {schema}.jobs AS s ON s.id = g.last_id
ORDER BY g.count DESC, g.error_group
