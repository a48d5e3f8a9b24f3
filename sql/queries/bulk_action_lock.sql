-- The running bulk action $1, locked for one batch; no row when it is not running, or when
-- another session runs a batch of it now (it is not waited for).
SELECT id, kind, filter::text AS filter, run_at, max_id, matched, done, skipped, cursor, state,
       error, actor, reason, created_at, updated_at, finished_at
FROM {schema}.bulk_actions
WHERE id = $1::bigint AND state = 'running'
FOR UPDATE SKIP LOCKED
