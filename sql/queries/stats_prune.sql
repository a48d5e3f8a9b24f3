-- Forget the rollup (migration 24) of up to $2 minutes older than $1 seconds, oldest first
-- (pruned with the finished jobs' longest retention); how many minutes went.
WITH gone AS (
    DELETE FROM {schema}.stats_rollup AS r
    WHERE r.minute = ANY(ARRAY(SELECT minute FROM {schema}.stats_rollup
                               WHERE minute < now() - make_interval(secs => $1::float8)
                               ORDER BY minute
                               LIMIT $2))
    RETURNING r.minute
), rows AS (
    DELETE FROM {schema}.stats_minutes AS s WHERE s.minute = ANY(ARRAY(SELECT minute FROM gone))
)
SELECT count(*) AS forgotten FROM gone
