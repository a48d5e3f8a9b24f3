-- The operator log page: what operators did, newest first, at most $4 entries older than the
-- cursor ($1 at, $2 source, $3 id; NULL for the newest page): queue controls and bulk actions
-- (operator_log, source 'queue') and the job changes an operator made (job_events with an actor:
-- replays, updates; source 'job'). A bulk action shows as its one entry (written when it was
-- created): the rows of its jobs, which name it under `bulk_action`, are left out. Each branch
-- reads its (at, id) index backwards (migrations 23 and 31) and stops after $4 rows.
SELECT * FROM (
    (SELECT 'queue' AS source, l.id, l.at, l.actor, l.action, l.queue, NULL::bigint AS job_id,
            l.reason, l.detail::text AS detail
     FROM {schema}.operator_log AS l
     WHERE NOT coalesce(l.detail ? 'bulk_action', false)
       AND ($1::timestamptz IS NULL
            OR (l.at <= $1 AND (l.at, 'queue', l.id) < ($1, $2::text, $3::bigint)))
     ORDER BY l.at DESC, l.id DESC
     LIMIT $4)
    UNION ALL
    (SELECT 'job' AS source, e.id, e.at, e.actor, e.kind AS action, NULL::text AS queue,
            e.job_id, e.reason, e.detail::text AS detail
     FROM {schema}.job_events AS e
     WHERE e.actor IS NOT NULL AND NOT coalesce(e.detail ? 'bulk_action', false)
       AND ($1::timestamptz IS NULL
            OR (e.at <= $1 AND (e.at, 'job', e.id) < ($1, $2::text, $3::bigint)))
     ORDER BY e.at DESC, e.id DESC
     LIMIT $4)
) AS entries
ORDER BY at DESC, source DESC, id DESC
LIMIT $4
