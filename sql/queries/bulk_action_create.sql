-- A new bulk action of kind $1 over the filter $2 (its JSON), run_at $3 (reschedule), the jobs up
-- to id $4, of which $5 matched, asked for by $6 for the reason $7. Logged once in operator_log
-- (action `bulk_<kind>`, detail: the action's id, how many jobs matched, the filter and run_at):
-- the one entry the log page shows for the action (migration 31), whatever number of jobs it
-- touches.
WITH created AS (
    INSERT INTO {schema}.bulk_actions (kind, filter, run_at, max_id, matched, actor, reason)
    VALUES ($1::text, $2::jsonb, $3::timestamptz, $4::bigint, $5::bigint, $6::text, $7::text)
    RETURNING *
), logged AS (
    INSERT INTO {schema}.operator_log (actor, action, reason, detail)
    SELECT c.actor, 'bulk_' || c.kind, c.reason,
           jsonb_build_object('action_id', c.id, 'matched', c.matched, 'filter', c.filter,
                              'run_at', c.run_at)
    FROM created AS c
)
SELECT id, kind, filter::text AS filter, run_at, max_id, matched, done, skipped, cursor, state,
       error, actor, reason, created_at, updated_at, finished_at
FROM created
