-- pgworker.testing: seconds from now until the earliest pending job that a claim of queues $1 and
-- (type, version) pairs would take is due (negative: already due); NULL when there is none. The
-- same filter as job_claim.sql: version 1 of the types $2, other versions as `type@version` in $3,
-- none of a paused queue, none parked (run_at 'infinity': a dependant waiting for its parents).
SELECT extract(epoch FROM min(run_at) - now())::float8
FROM {schema}.jobs
WHERE status = 'pending' AND queue = ANY($1::text[]) AND run_at < 'infinity'
  AND CASE WHEN version = 1 THEN type = ANY($2::text[])
           ELSE type || '@' || version = ANY($3::text[]) END
  AND queue <> ALL (ARRAY(SELECT c.name FROM {schema}.queues AS c WHERE c.paused_at IS NOT NULL))
