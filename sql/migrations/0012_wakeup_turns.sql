-- The jobs notification says what arrived, so that idle workers can take turns (issue 22, item 3).
--
-- One NOTIFY per statement and queue, as before, delivered only if the enqueuing transaction
-- commits; its payload is now a JSON object rather than the bare queue name:
--   {"queue": "default", "id": 1041, "count": 3, "types": ["email"]}
-- the queue, the smallest new job id, how many pending jobs arrived, and their type when they all
-- have the same one (null otherwise: min and max cost no sort, and byte order no collation). A worker reads it to decide
-- whether the claim is its turn (pgworker/_turns.py). A bare queue name (sent by the rescue and
-- by replay) still wakes every worker of that queue. Workers of earlier versions still running
-- after this migration no longer wake on new jobs: they find them at their next poll
-- (poll_interval), until they are replaced.
CREATE OR REPLACE FUNCTION {schema}.notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({jobs_channel}, json_build_object(
        'queue', q.queue,
        'id', q.first_id,
        'count', q.n,
        'types', CASE WHEN q.first_type = q.last_type THEN json_build_array(q.first_type) END)::text)
    FROM (SELECT queue, min(id) AS first_id, count(*) AS n,
                 min(type COLLATE "C") AS first_type, max(type COLLATE "C") AS last_type
          FROM new_jobs WHERE status = 'pending' GROUP BY queue) AS q;
    RETURN NULL;
END
$$;
