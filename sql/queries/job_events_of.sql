-- What people did to job $1 (its replays), oldest first.
SELECT e.kind, e.actor, e.reason, e.at, e.detail::text AS detail
FROM {schema}.job_events AS e
WHERE e.job_id = $1
ORDER BY e.at, e.id
