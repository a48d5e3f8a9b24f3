-- The recorded outcome of given attempts ($1 job ids, $2 attempt numbers, $3 their claims' times:
-- an attempt row starts at its claim's time). One probe of the primary key per attempt, whatever
-- the table held when the plan was made (see job_finish_many.sql); the time is compared by IS NOT
-- DISTINCT FROM, which no index of started_at can answer (started_at is never NULL).
SELECT a.job_id, a.outcome
FROM {schema}.job_attempts AS a
JOIN unnest($1::bigint[], $2::integer[], $3::timestamptz[]) AS r(job_id, attempt, claimed_at)
  ON a.job_id = ANY(ARRAY[r.job_id]) AND a.attempt = r.attempt
 AND a.started_at IS NOT DISTINCT FROM r.claimed_at
