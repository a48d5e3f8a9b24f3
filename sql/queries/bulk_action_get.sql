-- One bulk action, or no row; `runner` (and its kind, since when it holds the action, and until
-- when its lease runs) is who runs it (migration 29).
SELECT id, kind, filter::text AS filter, run_at, max_id, matched, done, skipped, cursor, state,
       error, actor, reason, created_at, updated_at, finished_at,
       runner, runner_kind, runner_since, lease_until
FROM {schema}.bulk_actions
WHERE id = $1::bigint
