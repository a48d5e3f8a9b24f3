-- The recorded outcome of given attempts ($1 job ids, $2 attempt numbers, $3 their claims' times:
-- an attempt row starts at its claim's time).
SELECT a.job_id, a.outcome
FROM {schema}.job_attempts AS a
JOIN unnest($1::bigint[], $2::integer[], $3::timestamptz[]) AS r(job_id, attempt, claimed_at)
  ON a.job_id = r.job_id AND a.attempt = r.attempt AND a.started_at = r.claimed_at
