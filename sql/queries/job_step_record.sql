-- Record step $4 of job $1 with its result ($5, JSON text), started at $6 (NULL: when the
-- transaction began, for a step that runs in this transaction). Fenced by the attempt: only
-- while job $1 is still running attempt $2 claimed at $3, its row locked (FOR SHARE) until the
-- transaction ends, so that a rescue or an outcome cannot slip between the check and the commit.
-- Returns the stored result: this one, or the one recorded first when the name was taken; no row
-- when the attempt no longer holds the job.
WITH held AS (
    SELECT id FROM {schema}.jobs
    WHERE id = $1 AND status = 'running' AND attempts = $2 AND claimed_at = $3
    FOR SHARE
)
INSERT INTO {schema}.job_steps AS s (job_id, name, result, attempt, started_at, finished_at)
SELECT id, $4, $5::jsonb, $2, coalesce($6::timestamptz, now()), clock_timestamp() FROM held
ON CONFLICT (job_id, name) DO UPDATE SET result = s.result
RETURNING s.result::text AS result
