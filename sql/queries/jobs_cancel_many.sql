-- A bulk cancel's batch: of the jobs $1, each pending one becomes cancelled at once and each
-- running one gets a cancel request that its worker acts on (as job_cancel.sql does for one);
-- each recorded in job_events (kind `cancelled`, actor $2, reason $3, the bulk action $4).
-- Returns the ids changed; the others (already finished) are left as they are.
WITH target AS (
    SELECT j.id, j.status FROM {schema}.jobs AS j
    WHERE j.id = ANY($1::bigint[]) AND j.status IN ('pending', 'running')
    ORDER BY j.id
    FOR UPDATE
), changed AS (
    UPDATE {schema}.jobs AS j
    SET status = CASE WHEN t.status = 'pending' THEN 'cancelled' ELSE j.status END,
        finished_at = CASE WHEN t.status = 'pending' THEN now() ELSE j.finished_at END,
        error = CASE WHEN t.status = 'pending' THEN 'Cancelled: cancelled by an operator'
                     ELSE j.error END,
        cancel_requested_at = now(),
        updated_at = now()
    FROM target AS t
    WHERE j.id = t.id
    RETURNING j.id
), recorded AS (
    INSERT INTO {schema}.job_events (job_id, kind, actor, reason, detail)
    SELECT t.id, 'cancelled', $2::text, $3::text,
           jsonb_build_object('previous_status', t.status, 'bulk_action', $4::bigint)
    FROM target AS t
)
SELECT c.id FROM changed AS c ORDER BY c.id
