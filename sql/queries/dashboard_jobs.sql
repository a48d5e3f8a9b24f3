-- The dashboard's list of jobs, newest first, paged by key on id: of status $1, type $2, queue $3
-- and correlation id $4 (each NULL for any), below id $5 (NULL: from the newest), at most $6.
-- Read backwards along the primary key; the payload and result stay out (one may hold 64 MB).
SELECT j.id, j.type, j.queue, j.status, j.priority, j.attempts, j.retry_count, j.max_retries,
       j.correlation_id, j.run_at, j.created_at, j.updated_at, j.finished_at, j.worker_id,
       left(j.error, 500) AS error, j.progress ->> 'milestone' AS milestone
FROM {schema}.jobs AS j
WHERE ($1::text IS NULL OR j.status = $1::text)
  AND ($2::text IS NULL OR j.type = $2::text)
  AND ($3::text IS NULL OR j.queue = $3::text)
  AND ($4::text IS NULL OR j.correlation_id = $4::text)
  AND ($5::bigint IS NULL OR j.id < $5::bigint)
ORDER BY j.id DESC
LIMIT $6
