-- The dead-letter set: failed jobs, newest failure first, optionally of type $1, of queue $2,
-- failed at or after $3; at most $4. Each with its attempts' first and last start times (read
-- from the job's attempt rows by their primary key).
SELECT j.id, j.type, j.queue, j.correlation_id, j.attempts, j.error, j.finished_at,
       (SELECT min(a.started_at) FROM {schema}.job_attempts AS a WHERE a.job_id = j.id)
           AS first_attempt_at,
       (SELECT max(a.started_at) FROM {schema}.job_attempts AS a WHERE a.job_id = j.id)
           AS last_attempt_at
FROM {schema}.jobs AS j
WHERE j.finished_at IS NOT NULL AND j.status = 'failed'
  AND ($1::text IS NULL OR j.type = $1::text)
  AND ($2::text IS NULL OR j.queue = $2::text)
  AND ($3::timestamptz IS NULL OR j.finished_at >= $3::timestamptz)
ORDER BY j.finished_at DESC, j.id DESC
LIMIT $4
