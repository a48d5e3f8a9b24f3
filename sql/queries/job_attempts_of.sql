-- Every attempt of job $1, in order: what `pgworker show` lists.
SELECT a.attempt, a.outcome, a.worker_id, a.started_at, a.finished_at, a.error_type,
       a.error_message, a.error_detail, a.code_version
FROM {schema}.job_attempts AS a
WHERE a.job_id = $1
ORDER BY a.attempt
