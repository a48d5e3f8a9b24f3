-- A bulk delete's batch: of the jobs $1, those finished (completed, failed, cancelled) are deleted
-- with everything recorded about them, as retention deletes them (_deleted_with_jobs.sql), and
-- the ids deleted are recorded in operator_log (action `delete`, actor $2, reason $3, the bulk
-- action $4): their job_events go with them. Returns the ids deleted.
WITH doomed AS (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE j.id = ANY($1::bigint[]) AND j.status IN ('completed', 'failed', 'cancelled')
    ORDER BY j.id
    FOR UPDATE
), gone AS (
    DELETE FROM {schema}.jobs AS j
    WHERE j.id = ANY(ARRAY(SELECT id FROM doomed))
      AND j.status IN ('completed', 'failed', 'cancelled')
    RETURNING j.id, j.has_dependants
), {deleted_with_jobs}, logged AS (
    INSERT INTO {schema}.operator_log (actor, action, reason, detail)
    SELECT $2::text, 'delete', $3::text,
           jsonb_build_object('bulk_action', $4::bigint,
                              'ids', (SELECT jsonb_agg(g.id ORDER BY g.id) FROM gone AS g))
    WHERE EXISTS (SELECT FROM gone)
)
SELECT g.id FROM gone AS g ORDER BY g.id
