-- Milestone $4 (detail $5, JSON text or NULL) of job $1, fenced by its attempt ($2, claimed at
-- $3): `jobs.progress` becomes {milestone, detail, at (ISO 8601, UTC), attempt} and the history
-- in job_milestones gains a row. Returns no row when the attempt no longer holds the job.
WITH noted AS (
    UPDATE {schema}.jobs
    SET progress = jsonb_build_object(
            'milestone', $4::text,
            'detail', $5::jsonb,
            'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
            'attempt', $2::integer),
        updated_at = now()
    WHERE id = $1 AND status = 'running' AND attempts = $2 AND claimed_at = $3
    RETURNING id
), kept AS (
    INSERT INTO {schema}.job_milestones (job_id, attempt, milestone, detail, at)
    SELECT id, $2, $4, $5::jsonb, now() FROM noted
)
SELECT id FROM noted
