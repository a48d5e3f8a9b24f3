-- Apply what the leader decided for jobs whose lease expired (their worker died, froze or was cut
-- off): $1-$6, one array per field, aligned: job id, attempt, claimed at, next status ('pending'
-- or 'failed'), seconds until it runs again, 1 when counted as a retry. A job whose cancellation
-- was asked for is cancelled instead of requeued. The open attempt is closed as `lost`, and the
-- workers of the queues that got jobs back are woken. The attempt's error and the job's get the
-- group (migration 30) of the attempt's words, computed once.
-- Fenced twice: by the leadership (nothing happens unless worker $7 holds a live maintenance
-- lease) and by the attempt (a job renewed, finished or claimed again since is left alone).
-- One probe of each table's primary key per job, whatever the tables held when the plan was made
-- (see job_finish_many.sql).
WITH expired AS (
    SELECT j.id, o.status, o.delay, o.retried,
           {schema}.error_group(j.type, 'WorkerLost',
                                'worker ' || j.worker_id || ' stopped renewing its lease',
                                NULL) AS error_group
    FROM unnest($1::bigint[], $2::integer[], $3::timestamptz[], $4::text[], $5::float8[],
                $6::integer[]) AS o(id, attempt, claimed_at, status, delay, retried)
    JOIN {schema}.jobs AS j ON j.id = ANY(ARRAY[o.id])
    -- The lease's check IS TRUE: no index condition, so that the jobs are found by id alone.
    WHERE j.status = 'running' AND (j.lease_expires_at < now()) IS TRUE AND j.attempts = o.attempt
      -- A row written by hand may hold a lease without a claim time: it is rescued all the same.
      AND j.claimed_at IS NOT DISTINCT FROM o.claimed_at
      AND EXISTS (SELECT FROM {schema}.leader
                  WHERE name = 'maintenance' AND worker_id = $7 AND expires_at > now())
    FOR UPDATE OF j SKIP LOCKED
), rescued AS (
    UPDATE {schema}.jobs AS j
    SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE e.status END,
        retry_count = j.retry_count + CASE WHEN j.cancel_requested_at IS NULL THEN e.retried
                                           ELSE 0 END,
        error = 'WorkerLost: worker ' || coalesce(j.worker_id, '?')
                || ' stopped renewing its lease (crashed, frozen or cut off)',
        error_group = e.error_group,
        run_at = CASE WHEN e.status = 'pending' AND j.cancel_requested_at IS NULL
                      THEN now() + make_interval(secs => e.delay) ELSE j.run_at END,
        finished_at = CASE WHEN e.status = 'pending' AND j.cancel_requested_at IS NULL THEN NULL
                           ELSE now() END,
        lease_expires_at = NULL,
        updated_at = now()
    FROM expired AS e
    WHERE j.id = ANY(ARRAY[e.id])
    RETURNING j.id, j.attempts, j.queue, j.status, j.worker_id, j.correlation_id, j.run_at,
              j.error_group
), closed AS (
    UPDATE {schema}.job_attempts AS a
    SET outcome = 'lost', finished_at = now(), error_type = 'WorkerLost',
        error_message = 'worker ' || r.worker_id || ' stopped renewing its lease',
        error_group = r.error_group
    FROM rescued AS r
    -- Every attempt of the job still open, not only the one numbered `attempts` (an operator
    -- may have reset that counter): the job runs nowhere now.
    WHERE a.job_id = ANY(ARRAY[r.id]) AND a.outcome = 'running'
), woken AS (
    SELECT pg_notify({jobs_channel}, q.queue)
    FROM (SELECT DISTINCT queue FROM rescued WHERE status = 'pending') AS q
)
SELECT r.id, r.attempts, r.correlation_id, r.status, r.worker_id, r.run_at,
       (SELECT count(*) FROM woken) AS queues_woken
FROM rescued AS r
