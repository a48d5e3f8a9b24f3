-- Cancel one job: a pending job becomes cancelled at once; a running job gets a cancel request
-- that its worker acts on. Returns the status the job had, or no row when there is no such job.
WITH target AS (
    SELECT id, status, worker_id FROM {schema}.jobs WHERE id = $1 FOR UPDATE
), changed AS (
    UPDATE {schema}.jobs AS j
    SET status = CASE WHEN t.status = 'pending' THEN 'cancelled' ELSE j.status END,
        finished_at = CASE WHEN t.status = 'pending' THEN now() ELSE j.finished_at END,
        error = CASE WHEN t.status = 'pending' THEN 'Cancelled: cancelled by an operator'
                     ELSE j.error END,
        cancel_requested_at = now(),
        updated_at = now()
    FROM target AS t
    WHERE j.id = t.id AND t.status IN ('pending', 'running')
)
SELECT status AS previous, worker_id FROM target
