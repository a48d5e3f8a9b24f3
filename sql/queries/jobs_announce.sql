-- Announce jobs as new ones, one notification of new jobs per queue (jobs_notification, migration
-- 0028): the jobs $1 (ids, aligned with their queues $2 and types $3) that ended under a limit,
-- whose room the worker that ran them passes on, so that the next workers in turn claim rather
-- than every worker of the queue. Returns how many notifications were sent.
SELECT count(pg_notify({jobs_channel},
                       {schema}.jobs_notification(q.queue, q.first_id, q.n, q.first_type,
                                                  q.last_type)))
FROM (SELECT e.queue, min(e.id) AS first_id, count(*) AS n,
             min(e.type COLLATE "C") AS first_type, max(e.type COLLATE "C") AS last_type
      FROM unnest($1::bigint[], $2::text[], $3::text[]) AS e(id, queue, type)
      GROUP BY e.queue) AS q
