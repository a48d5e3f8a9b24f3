-- The charts' enqueued jobs (issue 25, item 4): per bucket of $3 seconds (aligned on the epoch),
-- the jobs created from $1 to before $2, of queue $4 and type $5 (NULL: any), along the BRIN
-- index of jobs.created_at (migration 22). Jobs pruned since (retention) are not counted.
SELECT date_bin(make_interval(secs => $3::integer), j.created_at, 'epoch') AS bucket,
       count(*) AS enqueued
FROM {schema}.jobs AS j
WHERE j.created_at >= $1 AND j.created_at < $2
  AND ($4::text IS NULL OR j.queue = $4) AND ($5::text IS NULL OR j.type = $5)
GROUP BY 1
ORDER BY 1
