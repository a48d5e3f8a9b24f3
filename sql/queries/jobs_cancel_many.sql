-- A bulk cancel's batch: the jobs $1 that are pending or running are cancelled as a single
-- cancel does (_cancel.sql), each recorded in job_events (kind `cancelled`, actor $2, reason $3,
-- the bulk action $4). Returns the ids changed; the others (already finished) are left as they
-- are.
WITH target AS (
    SELECT j.id, j.status FROM {schema}.jobs AS j
    WHERE j.id = ANY($1::bigint[]) AND j.status IN ('pending', 'running')
    ORDER BY j.id
    FOR UPDATE
), {cancel}, recorded AS (
    INSERT INTO {schema}.job_events (job_id, kind, actor, reason, detail)
    SELECT t.id, 'cancelled', $2::text, $3::text,
           jsonb_build_object('previous_status', t.status, 'bulk_action', $4::bigint)
    FROM target AS t
)
SELECT c.id FROM changed AS c ORDER BY c.id
