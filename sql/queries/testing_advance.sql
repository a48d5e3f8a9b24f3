-- pgworker.testing: let $1 seconds pass for the pending jobs, as if the clock moved on: their
-- run_at (and the start of their retry budget) move $1 seconds earlier, so that a job due within
-- $1 seconds is due now, in the same order. The database's now() is the claim's clock and is
-- left alone. Rows another session holds locked (being claimed) are skipped rather than waited
-- for. Returns how many jobs moved.
WITH moved AS (
    UPDATE {schema}.jobs AS j
    SET run_at = j.run_at - make_interval(secs => $1::float8),
        budget_started_at = j.budget_started_at - make_interval(secs => $1::float8)
    WHERE j.id = ANY(ARRAY(SELECT id FROM {schema}.jobs
                           WHERE status = 'pending'
                           FOR UPDATE SKIP LOCKED))
    RETURNING 1
)
SELECT count(*) FROM moved
