-- enqueue(..., replace=True): the pending job $1 holding the unique key takes the payload $2,
-- priority $3 and run_at ($4, else now() + $5 seconds) of the enqueue (a debounce). A parked job
-- (run_at infinity: it waits for its parents or an event) keeps its run_at. No row: the job is
-- no longer pending. The workers of its queue are woken when the transaction commits.
WITH changed AS (
    UPDATE {schema}.jobs AS j
    SET payload = $2::jsonb,
        priority = $3,
        run_at = CASE WHEN j.run_at = 'infinity' THEN j.run_at
                      ELSE coalesce($4::timestamptz,
                                    now() + make_interval(secs => coalesce($5::float8, 0))) END,
        updated_at = now()
    WHERE j.id = $1 AND j.status = 'pending'
    RETURNING {job_columns}
)
SELECT changed.* FROM changed, LATERAL (SELECT pg_notify({jobs_channel}, changed.queue)) AS n
