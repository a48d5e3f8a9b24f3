-- The run and wait times, in seconds, of the job_attempts row `a`, as the charts count them
-- (stats_rollup.sql, stats_window.sql): the run is the handler's (run_ms; before migration 23,
-- the claim to the outcome's write), the wait the claim - the run_at it was claimed at (wait_ms;
-- before migration 23 only the job's latest attempt still has it, read off the job by its
-- primary key).
coalesce(a.run_ms / 1000.0,
         greatest(date_part('epoch', a.finished_at - a.started_at), 0)) AS run,
coalesce(a.wait_ms / 1000.0,
         (SELECT greatest(date_part('epoch', a.started_at - j.run_at), 0)
          FROM {schema}.jobs AS j
          WHERE j.id = a.job_id AND j.attempts = a.attempt
            AND j.status <> 'pending')) AS wait
