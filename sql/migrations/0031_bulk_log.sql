-- One operator-log entry per bulk action, rather than one per job it touched.
--
-- A bulk action writes one operator_log row when it is created (action `bulk <kind>`, detail:
-- the action's id, its filter and how many jobs matched; sql/queries/bulk_action_create.sql); its
-- jobs' own job_events (and a bulk delete's per-batch operator_log rows of the ids deleted) name
-- the action under `bulk_action` and stay in the jobs' history, but the log page
-- (sql/queries/dashboard_operator_log.sql) leaves them out and links the one entry to the
-- action's progress page. A bulk replay's events name their action from this release on.
--
-- The log page reads the operator's job_events newest first along (at, id); the index now holds
-- only the events that are not a bulk action's, so that a replay of a million jobs adds no entry
-- to it and the page never steps over a million of them to find its hundred rows.
--
-- Locks: one index build on job_events, holding off its writes (replays, updates, cancels) while
-- it reads the table once; the old index is dropped after.
CREATE INDEX job_events_operator_at_idx ON {schema}.job_events (at, id)
    WHERE actor IS NOT NULL AND NOT coalesce(detail ? 'bulk_action', false);
DROP INDEX {schema}.job_events_at_idx;
