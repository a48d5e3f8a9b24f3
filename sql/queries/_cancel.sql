-- The cancel of the jobs of CTE `target` (id, status), the single one's and a bulk action's: a
-- pending job becomes cancelled at once; a running one gets a cancel request, and its worker is
-- told on the cancel channel (the job's id) when the transaction commits, so that the handler
-- stops now rather than at the worker's next heartbeat. A job in another status is left as it
-- is. `changed`: each job changed, with the status it had.
changed AS (
    UPDATE {schema}.jobs AS j
    SET status = CASE WHEN t.status = 'pending' THEN 'cancelled' ELSE j.status END,
        finished_at = CASE WHEN t.status = 'pending' THEN now() ELSE j.finished_at END,
        error = CASE WHEN t.status = 'pending' THEN 'Cancelled: cancelled by an operator'
                     ELSE j.error END,
        -- Not a failure: no group (migration 30), whatever group the error it replaces had.
        error_group = CASE WHEN t.status = 'pending' THEN NULL ELSE j.error_group END,
        cancel_requested_at = now(),
        updated_at = now()
    FROM target AS t
    WHERE j.id = t.id AND t.status IN ('pending', 'running')
    -- RETURNING is computed for each row the update writes, whether or not the query reads it:
    -- the notice goes with the write.
    RETURNING j.id, t.status AS previous,
              CASE WHEN t.status = 'running' THEN pg_notify({cancel_channel}, j.id::text) END
                  AS notified
)
