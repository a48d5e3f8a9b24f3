-- Every attempt of job $1, in order: what `pgworker show` lists. run_ms: the handler's run
-- time; wait_ms: how long the job waited past its run_at for this claim (migration 23).
SELECT a.attempt, a.outcome, a.worker_id, a.started_at, a.finished_at, a.error_type,
       a.error_message, a.error_detail, a.code_version, a.run_ms::float8 AS run_ms,
       a.wait_ms::float8 AS wait_ms
FROM {schema}.job_attempts AS a
WHERE a.job_id = $1
ORDER BY a.attempt
