-- Queue controls (issue 23): what operators set on a queue as a whole, read by every worker's
-- claim, so that the whole fleet obeys at once and the setting survives restarts. One row per
-- queue that has ever been controlled; a queue without a row has no controls (the claim of such
-- a queue costs one primary-key probe and reads nothing else here).
--
-- Pausing: a queue whose paused_at is set is not claimed from (sql/queries/job_claim.sql); its
-- jobs wait as pending and running ones finish. Resuming clears the three pause columns. The
-- limits of the same issue (max_running, a rate) are columns that their own migration adds to
-- this row: NULL there will mean "no limit", as a NULL paused_at means "not paused".
CREATE TABLE {schema}.queues (
    name         text        PRIMARY KEY,
    paused_at    timestamptz,
    paused_by    text,
    pause_reason text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- What operators did to queues (pause, resume; the limits' changes later): who, when, what,
-- why, one row per change that took effect (a pause of a paused queue changes nothing and adds
-- no row). Unlike job_events, it names no job: pruning jobs never deletes from it, and pgworker
-- never deletes from it at all.
CREATE TABLE {schema}.operator_log (
    id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at     timestamptz NOT NULL DEFAULT now(),
    actor  text        NOT NULL,
    action text        NOT NULL,
    queue  text,
    reason text,
    detail jsonb
);
CREATE INDEX operator_log_queue_idx ON {schema}.operator_log (queue, at);
