-- The failures grouped by their error's first line ("ValueError: remote down"): how many jobs
-- each, the first and last time one of them finished; of the finished jobs matching the filter
-- ($1-$11, _job_filter.sql: the caller bounds the finish time, so that the range scan of
-- jobs_finished_idx reads only that window), the largest groups first, at most $12.
SELECT left(split_part(j.error, E'\n', 1), 500) AS error, count(*) AS jobs,
       min(j.finished_at) AS first_at, max(j.finished_at) AS last_at
FROM {schema}.jobs AS j
WHERE j.finished_at IS NOT NULL AND j.error IS NOT NULL AND {job_filter}
GROUP BY 1
ORDER BY count(*) DESC, 1
LIMIT $12
