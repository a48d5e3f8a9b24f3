-- Retention: delete up to $3 finished jobs, oldest first, each older than the age its status is
-- given ($1 statuses and $2 ages in seconds, aligned; a status not listed is kept), with their
-- attempts, steps, milestones, events, event waits and links to dependants. Returns how many jobs
-- of each status went.
--
-- One range scan of jobs_finished_idx, bounded by the youngest age: the rows of a status kept
-- longer are skipped within it. Rows locked by anyone else (a replay) are skipped, and every lock
-- is held for one batch only, so pruning never waits on claims nor makes them wait: claims take
-- pending jobs, which have no finished_at. With $4, the leader's worker id, nothing is deleted
-- unless that worker still holds a live maintenance lease (the fence of jobs_rescue.sql).
WITH rules AS (
    SELECT r.status, now() - make_interval(secs => r.age) AS before
    FROM unnest($1::text[], $2::float8[]) AS r(status, age)
), doomed AS (
    SELECT j.id
    FROM {schema}.jobs AS j
    WHERE j.finished_at IS NOT NULL
      AND j.finished_at < (SELECT max(before) FROM rules)
      AND j.status IN ('completed', 'failed', 'cancelled')
      AND j.finished_at < (SELECT r.before FROM rules AS r WHERE r.status = j.status)
      AND ($4::text IS NULL
           OR EXISTS (SELECT FROM {schema}.leader
                      WHERE name = 'maintenance' AND worker_id = $4::text
                        AND expires_at > now()))
    ORDER BY j.finished_at
    LIMIT $3
    FOR UPDATE OF j SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.jobs AS j
    WHERE j.id = ANY(ARRAY(SELECT id FROM doomed))
    RETURNING j.id, j.status, j.has_dependants
), {deleted_with_jobs}
SELECT g.status, count(*) AS jobs FROM gone AS g GROUP BY g.status
