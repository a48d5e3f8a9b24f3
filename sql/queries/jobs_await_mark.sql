-- Mark jobs as awaited ($1: their ids), so that their end is announced on the ended channel
-- (migration 0018's trigger). Sent after LISTEN and before the jobs are read (jobs_awaited.sql),
-- each in its own statement: a job that ends after this commits is announced, one that ended
-- before is read as ended. Only unfinished jobs not already marked are written.
--
-- A job whose row another transaction holds locked (a caller's enqueue after= it, an update_job
-- or a replay not yet committed, a transactional step's fence) is skipped, not waited for: the
-- waiter's one connection serves every wait of the process, and a wait on one locked job must
-- not hold the others. Returns the ids skipped so (unfinished, unmarked, locked): the waiter
-- marks them again on its next poll, and reads them on every poll until then.
WITH wanted AS (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE j.id = ANY($1::bigint[]) AND NOT j.awaited AND j.status IN ('pending', 'running')
), free AS (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE j.id = ANY($1::bigint[]) AND NOT j.awaited AND j.status IN ('pending', 'running')
    FOR NO KEY UPDATE SKIP LOCKED
), marked AS (
    -- = ANY(ARRAY(...)), not a join: primary-key probes even in a plan made on an empty table.
    UPDATE {schema}.jobs AS j SET awaited = true
    WHERE j.id = ANY(ARRAY(SELECT id FROM free))
    RETURNING j.id
)
SELECT w.id FROM wanted AS w WHERE w.id NOT IN (SELECT id FROM marked)
