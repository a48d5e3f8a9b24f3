-- One bulk action, or no row.
SELECT id, kind, filter::text AS filter, run_at, max_id, matched, done, skipped, cursor, state,
       error, actor, reason, created_at, updated_at, finished_at
FROM {schema}.bulk_actions
WHERE id = $1::bigint
