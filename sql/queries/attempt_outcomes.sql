-- The recorded outcome of given attempts ($1 job ids, $2 attempt numbers).
SELECT a.job_id, a.outcome
FROM {schema}.job_attempts AS a
JOIN unnest($1::bigint[], $2::integer[]) AS r(job_id, attempt)
  ON a.job_id = r.job_id AND a.attempt = r.attempt
