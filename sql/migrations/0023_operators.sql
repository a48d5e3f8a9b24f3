-- Named operators and one word for one thing (issue 25, items 6 and 8).
--
-- The operator log page (/ui/log) reads operator_log (queue controls) and the job_events that
-- an operator caused (replays, updates: actor set) newest first, a page at a time by keyset:
-- one index each, on (at, id), the job_events one partial (events without an actor are not an
-- operator's).
--
-- One duration per attempt: `run_ms`, the handler's run time in milliseconds, written by the
-- outcome's update of the attempt row (no extra write; NULL for attempts that never reported:
-- still running, lost, or older than this migration; for an HTTP worker, the time from its claim
-- to its report), and `wait_ms`, how long the job waited past its run_at before this attempt
-- claimed it, written by the claim's insert of the attempt row. Both `real`: 4 bytes a row.
--
-- Locks: two nullable columns without default (catalog only, no rewrite) and two index builds,
-- each holding off writes to its table (operator_log, job_events: operators' actions only) while
-- it is built.
ALTER TABLE {schema}.job_attempts ADD COLUMN run_ms real, ADD COLUMN wait_ms real;
CREATE INDEX operator_log_at_idx ON {schema}.operator_log (at, id);
CREATE INDEX job_events_at_idx ON {schema}.job_events (at, id) WHERE actor IS NOT NULL;
