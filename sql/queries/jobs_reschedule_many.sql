-- A bulk reschedule's batch: the pending jobs of $1 that are not parked (run_at infinity: waiting
-- for an event) run no sooner than $2; each recorded in job_events (kind `updated`, actor $3,
-- reason $4, the run_at before and after, the bulk action $5), and the workers of their queues
-- are woken when the transaction commits. Returns the ids changed.
WITH target AS (
    SELECT j.id, j.run_at FROM {schema}.jobs AS j
    WHERE j.id = ANY($1::bigint[]) AND j.status = 'pending' AND j.run_at <> 'infinity'
    ORDER BY j.id
    FOR UPDATE
), changed AS (
    UPDATE {schema}.jobs AS j
    SET run_at = $2::timestamptz, updated_at = now()
    FROM target AS t
    WHERE j.id = t.id
    RETURNING j.id, j.queue
), recorded AS (
    INSERT INTO {schema}.job_events (job_id, kind, actor, reason, detail)
    SELECT t.id, 'updated', $3::text, $4::text,
           jsonb_build_object('run_at', jsonb_build_array(t.run_at, $2::timestamptz),
                              'bulk_action', $5::bigint)
    FROM target AS t
), woken AS (
    SELECT pg_notify({jobs_channel}, q.queue) FROM (SELECT DISTINCT queue FROM changed) AS q
)
SELECT c.id, (SELECT count(*) FROM woken) AS queues_woken FROM changed AS c ORDER BY c.id
