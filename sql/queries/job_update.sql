-- update_job: the pending job $1 takes the run_at $2, priority $3 and payload $4 given (NULL:
-- kept as it is). Returns the job as it is afterwards with the status it had before (`previous`)
-- and whether it changed; no row when there is no such job. A job that is not pending, or one
-- parked (run_at infinity) when a run_at is given, is left as it is. The change is recorded in
-- job_events (kind `updated`, actor $5, detail: the fields before and after) and the workers of
-- the job's queue are woken when the transaction commits.
WITH target AS (
    SELECT j.id, j.status, j.run_at, j.priority FROM {schema}.jobs AS j WHERE j.id = $1 FOR UPDATE
), changed AS (
    UPDATE {schema}.jobs AS j
    SET run_at = coalesce($2::timestamptz, j.run_at),
        priority = coalesce($3::integer, j.priority),
        payload = coalesce($4::jsonb, j.payload),
        updated_at = now()
    FROM target AS t
    WHERE j.id = t.id AND t.status = 'pending'
      AND NOT ($2::timestamptz IS NOT NULL AND t.run_at = 'infinity')
    RETURNING {job_columns}
), recorded AS (
    INSERT INTO {schema}.job_events (job_id, kind, actor, detail)
    SELECT c.id, 'updated', $5::text,
           jsonb_strip_nulls(jsonb_build_object(
               'run_at', CASE WHEN $2::timestamptz IS NOT NULL
                              THEN jsonb_build_array(t.run_at, c.run_at) END,
               'priority', CASE WHEN $3::integer IS NOT NULL
                                THEN jsonb_build_array(t.priority, c.priority) END,
               'payload', CASE WHEN $4::jsonb IS NOT NULL THEN 'changed' END))
    FROM changed AS c JOIN target AS t ON t.id = c.id
), woken AS (
    SELECT pg_notify({jobs_channel}, c.queue) FROM changed AS c
)
SELECT t.status AS previous, t.run_at AS previous_run_at, c.id IS NOT NULL AS changed,
       (SELECT count(*) FROM woken) AS woken, c.*
FROM target AS t
LEFT JOIN changed AS c ON c.id = t.id
