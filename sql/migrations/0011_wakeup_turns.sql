-- The jobs notification says what arrived, so that idle workers can take turns (issue 22, item 3).
--
-- One NOTIFY per statement and queue, as before, delivered only if the enqueuing transaction
-- commits; its payload is now a JSON object rather than the bare queue name:
--   {"queue": "default", "id": 1041, "count": 3, "types": ["email"]}
-- the queue, the smallest new job id, how many pending jobs arrived, and their types (null when
-- more than 8, or longer than 2,000 bytes together: a payload must stay under 8,000 bytes). A
-- worker reads it to decide whether the claim is its turn (pgworker/_turns.py). A bare queue
-- name (sent by the rescue and by replay) still wakes every worker of that queue. Workers of
-- earlier versions still running after this migration no longer wake on new jobs: they find
-- them at their next poll (poll_interval), until they are replaced.
CREATE OR REPLACE FUNCTION {schema}.notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({jobs_channel}, json_build_object(
        'queue', q.queue,
        'id', q.first_id,
        'count', q.n,
        'types', CASE WHEN cardinality(q.types) <= 8
                       AND octet_length(array_to_string(q.types, '')) <= 2000
                      THEN q.types END)::text)
    FROM (SELECT queue, min(id) AS first_id, count(*) AS n, array_agg(DISTINCT type) AS types
          FROM new_jobs WHERE status = 'pending' GROUP BY queue) AS q;
    RETURN NULL;
END
$$;
