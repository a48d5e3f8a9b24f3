-- A page of the dashboard's job list in the order a person chose: the jobs matching the filter
-- ($1-$12, _job_filter.sql), with the columns of jobs_filtered.sql, ordered by the column $13
-- (created, run_at, attempts, finished or run_time, the last attempt's; the caller checks it
-- against its allow-list, and any other word orders by id alone) ascending, or descending when
-- $14, then by id the same way: a stable order, ties never swap places between two pages. Jobs
-- without the value (never finished, never run) come last either way. `sort_key` is the row's
-- value (negated when descending) and `id_key` its id (negated too); the next page starts after
-- the last row's ($15, $16; $16 NULL: the first page), at most $17 rows. Unlike the default
-- order (newest id, along the primary key), this reads every matching job and sorts them (the
-- page's columns are read for its rows only): a filter narrows it, and the request's statement
-- timeout bounds it.
WITH page AS (
    SELECT j.id, k.sort_key, CASE WHEN $14::boolean THEN -j.id ELSE j.id END AS id_key
    FROM {schema}.jobs AS j
    -- Read for run_time only: planned with the values (plan_with_values), the other orders fold
    -- it away, and the join on job_attempts' primary key is removed.
    LEFT JOIN {schema}.job_attempts AS a ON a.job_id = j.id AND a.attempt = j.attempts
    CROSS JOIN LATERAL (
        SELECT CASE WHEN $14::boolean THEN -x.value ELSE x.value END AS sort_key
        FROM (
            SELECT CASE $13::text
                       WHEN 'created' THEN date_part('epoch', j.created_at)
                       WHEN 'run_at' THEN date_part('epoch', j.run_at)
                       WHEN 'attempts' THEN j.attempts::float8
                       WHEN 'finished' THEN date_part('epoch', j.finished_at)
                       WHEN 'run_time' THEN coalesce(a.run_ms / 1000.0,
                                                     date_part('epoch', a.finished_at - a.started_at))
                   END::float8 AS value
        ) AS x
    ) AS k
    WHERE {job_filter}
      AND ($16::bigint IS NULL
           OR ($15::float8 IS NOT NULL
               AND (k.sort_key > $15::float8
                    OR (k.sort_key = $15::float8
                        AND CASE WHEN $14::boolean THEN -j.id ELSE j.id END > $16::bigint)
                    OR k.sort_key IS NULL))
           OR ($15::float8 IS NULL AND k.sort_key IS NULL
               AND CASE WHEN $14::boolean THEN -j.id ELSE j.id END > $16::bigint))
    ORDER BY k.sort_key NULLS LAST, id_key
    LIMIT $17
)
SELECT {job_list_columns}, p.sort_key, p.id_key
FROM page AS p
JOIN {schema}.jobs AS j ON j.id = p.id
{job_list_joins}
ORDER BY p.sort_key NULLS LAST, p.id_key
