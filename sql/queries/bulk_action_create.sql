-- A new bulk action of kind $1 over the filter $2 (its JSON), run_at $3 (reschedule), the jobs up
-- to id $4, of which $5 matched, asked for by $6 for the reason $7.
INSERT INTO {schema}.bulk_actions (kind, filter, run_at, max_id, matched, actor, reason)
VALUES ($1::text, $2::jsonb, $3::timestamptz, $4::bigint, $5::bigint, $6::text, $7::text)
RETURNING id, kind, filter::text AS filter, run_at, max_id, matched, done, skipped, cursor, state,
          error, actor, reason, created_at, updated_at, finished_at
