-- The running bulk action $1, locked for one batch, and its lease renewed to now + $3 seconds; no
-- row when it is not running, when runner $2 does not hold it (another runner took it over: see
-- bulk_actions_claim.sql), or when another session runs a batch of it now (it is not waited for).
-- $2 null: whoever holds it (pgworker._bulk.run_batch without a runner; the lease is left as it
-- is).
WITH locked AS (
    SELECT id
    FROM {schema}.bulk_actions
    WHERE id = $1::bigint AND state = 'running'
      AND ($2::text IS NULL OR runner = $2::text)
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.bulk_actions AS a
SET lease_until = CASE WHEN $2::text IS NULL THEN a.lease_until
                       ELSE now() + make_interval(secs => $3::float8) END
FROM locked
WHERE a.id = locked.id
RETURNING a.id, a.kind, a.filter::text AS filter, a.run_at, a.max_id, a.matched, a.done,
          a.skipped, a.cursor, a.state, a.error, a.actor, a.reason, a.created_at, a.updated_at,
          a.finished_at, a.runner, a.runner_kind, a.runner_since, a.lease_until
