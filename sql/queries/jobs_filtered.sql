-- A page of the job lists (the dashboard's, `pgworker jobs list`): the jobs matching the filter
-- ($1-$11, _job_filter.sql), newest first, paged by key on id: below id $12 (NULL: from the
-- newest), at most $13. Read backwards along the primary key, never counted; the payload and
-- result stay out (one may hold 64 MB). Each row has its error's first line and the traceback
-- of its last attempt (one primary-key probe of job_attempts).
SELECT j.id, j.type, j.queue, j.status, j.priority, j.attempts, j.retry_count, j.max_retries,
       j.correlation_id, j.run_at, j.created_at, j.updated_at, j.finished_at, j.worker_id,
       left(split_part(j.error, E'\n', 1), 500) AS error,
       (SELECT left(a.error_detail, 8000) FROM {schema}.job_attempts AS a
        WHERE j.error IS NOT NULL AND a.job_id = j.id AND a.attempt = j.attempts) AS error_detail,
       j.progress ->> 'milestone' AS milestone
FROM {schema}.jobs AS j
WHERE {job_filter}
  AND ($12::bigint IS NULL OR j.id < $12::bigint)
ORDER BY j.id DESC
LIMIT $13
