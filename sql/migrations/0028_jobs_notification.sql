-- The payload of a notification of new jobs, built in one place: the enqueue trigger, the
-- release of dependants, the room that ended limited jobs pass on (jobs_announce.sql) and a turn
-- passed on (jobs_pass.sql) all call this function. The payload is the JSON object workers read
-- to decide whose turn it is to claim (pgworker/_runtime/turns.py):
--   {"queue" : "default", "id" : 1041, "count" : 3, "types" : ["email"]}
-- the queue, the smallest new job id, how many pending jobs arrived, and their type when they all
-- have the same one (`first_type` = `last_type`; null otherwise); a turn passed on also says how
-- many times it was (`hops`). The text is byte for byte what the triggers sent before, so that
-- workers of every release, and PostgreSQL's folding of equal notifications in a transaction,
-- see no change.
--
-- A SQL function without FROM, STABLE as its body: the planner inlines it into the statement
-- that calls it. EXECUTE is granted to PUBLIC whatever the default privileges of the role that
-- migrates: every role that enqueues runs it, through the triggers.
CREATE FUNCTION {schema}.jobs_notification(queue text, first_id bigint, n bigint,
                                           first_type text, last_type text,
                                           hops integer DEFAULT NULL)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN hops IS NULL
                THEN json_build_object(
                    'queue', queue, 'id', first_id, 'count', n,
                    'types', CASE WHEN first_type = last_type
                                  THEN json_build_array(first_type) END)
                ELSE json_build_object(
                    'queue', queue, 'id', first_id, 'count', n,
                    'types', CASE WHEN first_type = last_type
                                  THEN json_build_array(first_type) END,
                    'hops', hops)
           END::text
$$;

GRANT EXECUTE ON FUNCTION {schema}.jobs_notification(text, bigint, bigint, text, text, integer)
    TO PUBLIC;

-- One NOTIFY per statement and queue, delivered only if the enqueuing transaction commits.
CREATE OR REPLACE FUNCTION {schema}.notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({jobs_channel},
                      {schema}.jobs_notification(q.queue, q.first_id, q.n, q.first_type,
                                                 q.last_type))
    FROM (SELECT queue, min(id) AS first_id, count(*) AS n,
                 min(type COLLATE "C") AS first_type, max(type COLLATE "C") AS last_type
          FROM new_jobs WHERE status = 'pending' GROUP BY queue) AS q;
    RETURN NULL;
END
$$;

-- A parent's end releases its dependants (as migration 0019 wrote it), whose queues' workers are
-- woken as by an enqueue.
CREATE OR REPLACE FUNCTION {schema}.release_dependants() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_failed boolean := NEW.status IN ('failed', 'cancelled');
    v_woken  bigint;
BEGIN
    WITH children AS (
        SELECT c.id
        FROM {schema}.job_dependencies AS d
        JOIN {schema}.jobs AS c ON c.id = d.child_id
        WHERE d.parent_id = NEW.id AND c.status = 'pending' AND c.run_at = 'infinity'
          AND c.parents_left > 0
        ORDER BY c.id
        FOR UPDATE OF c
    ), released AS (
        UPDATE {schema}.jobs AS c
        SET status = CASE WHEN v_failed AND c.on_parent_failure = 'cancel' THEN 'cancelled'
                          ELSE 'pending' END,
            finished_at = CASE WHEN v_failed AND c.on_parent_failure = 'cancel' THEN now() END,
            error = CASE WHEN v_failed AND c.on_parent_failure = 'cancel'
                         THEN format('ParentFailed: parent %s %s', NEW.id, NEW.status)
                         ELSE c.error END,
            parents_left = CASE WHEN v_failed AND c.on_parent_failure = 'cancel'
                                THEN c.parents_left ELSE c.parents_left - 1 END,
            run_at = CASE WHEN NOT (v_failed AND c.on_parent_failure = 'cancel')
                               AND c.parents_left = 1
                          THEN now() ELSE c.run_at END,
            updated_at = now()
        WHERE c.id = ANY(ARRAY(SELECT id FROM children))
        RETURNING c.id, c.queue, c.type, c.status, c.parents_left
    )
    -- The workers of the released jobs' queues are woken as by an enqueue (see notify_jobs).
    SELECT count(pg_notify({jobs_channel},
                           {schema}.jobs_notification(q.queue, q.first_id, q.n, q.first_type,
                                                      q.last_type)))
    INTO v_woken
    FROM (SELECT queue, min(id) AS first_id, count(*) AS n,
                 min(type COLLATE "C") AS first_type, max(type COLLATE "C") AS last_type
          FROM released WHERE status = 'pending' AND parents_left = 0
          GROUP BY queue) AS q;
    RETURN NULL;
END
$$;
