-- Jobs whose lease expired (their worker died, froze or was cut off): back to pending, counted as
-- a retry, or failed when out of retries, or cancelled when a cancel was asked for; the open
-- attempt is closed as `lost`. Wakes the workers of the queues that got jobs back ($1: channel).
-- Fenced by the leadership: nothing happens unless worker $2 holds a live maintenance lease.
-- $3: only these jobs (NULL: any); $4: never these (rows the database refused to rescue).
WITH expired AS (
    SELECT id
    FROM {schema}.jobs
    WHERE status = 'running' AND lease_expires_at < now()
      AND ($3::bigint[] IS NULL OR id = ANY($3::bigint[])) AND NOT (id = ANY($4::bigint[]))
      AND EXISTS (SELECT FROM {schema}.leader
                  WHERE name = 'maintenance' AND worker_id = $2 AND expires_at > now())
    ORDER BY lease_expires_at
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
), rescued AS (
    UPDATE {schema}.jobs AS j
    SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                      WHEN j.retry_count < coalesce(j.max_retries, 0) THEN 'pending'
                      ELSE 'failed' END,
        retry_count = CASE WHEN j.cancel_requested_at IS NULL
                            AND j.retry_count < coalesce(j.max_retries, 0)
                           THEN j.retry_count + 1 ELSE j.retry_count END,
        error = 'WorkerLost: worker ' || coalesce(j.worker_id, '?')
                || ' stopped renewing its lease (crashed, frozen or cut off)',
        run_at = now(),
        finished_at = CASE WHEN j.cancel_requested_at IS NULL
                            AND j.retry_count < coalesce(j.max_retries, 0)
                           THEN NULL ELSE now() END,
        lease_expires_at = NULL,
        updated_at = now()
    FROM expired
    WHERE j.id = expired.id
    RETURNING j.id, j.attempts, j.queue, j.status, j.worker_id, j.correlation_id
), closed AS (
    UPDATE {schema}.job_attempts AS a
    SET outcome = 'lost', finished_at = now(), error_type = 'WorkerLost',
        error_message = 'worker ' || r.worker_id || ' stopped renewing its lease'
    FROM rescued AS r
    WHERE a.job_id = r.id AND a.attempt = r.attempts AND a.outcome = 'running'
), woken AS (
    SELECT pg_notify($1, q.queue)
    FROM (SELECT DISTINCT queue FROM rescued WHERE status = 'pending') AS q
)
SELECT r.id, r.attempts, r.correlation_id, r.status, r.worker_id,
       (SELECT count(*) FROM woken) AS queues_woken
FROM rescued AS r
