-- A replayed dependant recounts its parents in the replay's own statement
-- (sql/queries/jobs_replay.sql), not in a BEFORE UPDATE trigger on `jobs`. A BEFORE ROW trigger
-- on UPDATE, even one whose WHEN clause is false, makes PostgreSQL fetch and lock each updated
-- row once more before its WHEN clause is read: one more tuple lock (and WAL record) for the
-- claim's update and for the outcome's, on every job, for the sake of replays of dependants.
-- The AFTER triggers of migrations 18 and 19 stay: they cost no such fetch. Replaying a job is
-- `pgworker replay`, the API, the dashboard or `pgworker.replay`; a hand-written UPDATE that
-- moves a dependant from failed or cancelled back to pending no longer recounts its parents.
DROP TRIGGER jobs_recount_parents ON {schema}.jobs;
DROP FUNCTION {schema}.recount_parents();
