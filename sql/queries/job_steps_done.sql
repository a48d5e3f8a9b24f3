-- The steps a job has done, read once per attempt (at its first step): name and stored result,
-- with `held`, whether attempt $2 claimed at $3 still holds job $1. One row with a NULL name when
-- there are none; no step rows when the attempt lost the job (it must not run a step).
SELECT h.held, s.name, s.result::text AS result
FROM (SELECT EXISTS (SELECT FROM {schema}.jobs
                     WHERE id = $1 AND status = 'running' AND attempts = $2
                       AND claimed_at = $3) AS held) AS h
LEFT JOIN {schema}.job_steps AS s ON h.held AND s.job_id = $1
