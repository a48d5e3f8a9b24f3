-- Replay jobs $1: those failed or cancelled go back to pending now, with a fresh set of retries
-- and a fresh retry-time budget, their error and cancel request cleared. `attempts` is kept, so
-- the next attempt is numbered after the last one and the attempts' history stays whole. Each
-- replay is recorded in job_events (actor $2, reason $3), and the workers of their queues are
-- woken when the transaction commits. Returns one row per job found, with the status it had and
-- whether it was replayed; the other jobs are left as they are.
WITH target AS (
    SELECT j.id, j.status
    FROM {schema}.jobs AS j
    WHERE j.id = ANY($1::bigint[])
    ORDER BY j.id
    FOR UPDATE
), replayed AS (
    UPDATE {schema}.jobs AS j
    SET status = 'pending',
        retry_count = 0,
        error = NULL,
        budget_started_at = NULL,
        cancel_requested_at = NULL,
        finished_at = NULL,
        lease_expires_at = NULL,
        run_at = now(),
        updated_at = now()
    FROM target AS t
    WHERE j.id = t.id AND t.status IN ('failed', 'cancelled')
    RETURNING j.id, j.type, j.queue, j.attempts, j.correlation_id
), recorded AS (
    INSERT INTO {schema}.job_events (job_id, kind, actor, reason, detail)
    SELECT r.id, 'replayed', $2::text, $3::text,
           jsonb_build_object('previous_status', t.status, 'attempts', r.attempts)
    FROM replayed AS r
    JOIN target AS t ON t.id = r.id
), woken AS (
    SELECT pg_notify({jobs_channel}, q.queue)
    FROM (SELECT DISTINCT queue FROM replayed) AS q
)
SELECT t.id, t.status AS previous, r.id IS NOT NULL AS replayed, r.type, r.queue, r.attempts,
       r.correlation_id, (SELECT count(*) FROM woken) AS queues_woken
FROM target AS t
LEFT JOIN replayed AS r ON r.id = t.id
ORDER BY t.id
