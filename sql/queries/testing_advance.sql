-- pgworker.testing: let $1 seconds pass for the pending jobs, as if the clock moved on: their
-- run_at (and the start of their retry budget) move $1 seconds earlier, so that a job due within
-- $1 seconds is due now, in the same order. The database's now() is the claim's clock and is
-- left alone. Returns how many jobs moved.
WITH moved AS (
    UPDATE {schema}.jobs
    SET run_at = run_at - make_interval(secs => $1::float8),
        budget_started_at = budget_started_at - make_interval(secs => $1::float8)
    WHERE status = 'pending'
    RETURNING 1
)
SELECT count(*) FROM moved
