-- Cancel one job ($1), as a bulk cancel does each (_cancel.sql). Returns the status the job had
-- and its worker, or no row when there is no such job.
WITH target AS (
    SELECT id, status, worker_id FROM {schema}.jobs WHERE id = $1 FOR UPDATE
), {cancel}
SELECT status AS previous, worker_id FROM target
