-- Every milestone job $1 reported, oldest first (for `pgworker show`).
SELECT seq, attempt, milestone, detail::text AS detail, at
FROM {schema}.job_milestones
WHERE job_id = $1
ORDER BY seq
