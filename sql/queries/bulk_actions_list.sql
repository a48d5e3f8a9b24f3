-- The bulk actions newest first (the console's actions page, GET /jobs/actions): those in state $1
-- (NULL: any) with an id below $2 (NULL: from the newest), at most $3, along the primary key; the
-- columns of bulk_action_get.sql.
SELECT id, kind, filter::text AS filter, run_at, max_id, matched, done, skipped, cursor, state,
       error, actor, reason, created_at, updated_at, finished_at,
       runner, runner_kind, runner_since, lease_until
FROM {schema}.bulk_actions
WHERE ($1::text IS NULL OR state = $1::text)
  AND ($2::bigint IS NULL OR id < $2::bigint)
ORDER BY id DESC
LIMIT $3
