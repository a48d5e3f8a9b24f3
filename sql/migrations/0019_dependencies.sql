-- Dependencies and fan-in (issue 24, item 3): `enqueue(..., after=[ids], on_parent_failure=)`.
--
-- A dependant is `pending` with run_at = 'infinity' ("parked"): the claim reads jobs with
-- run_at <= now(), so it never takes one, and in the claim index parked jobs sort last within
-- their priority. When its last parent ends, it gets run_at = now() and the workers of its queue
-- are notified as for a new job. Every column below is nullable or has a constant default: the
-- migration rewrites nothing and holds its lock for an instant.
--
-- parents:           the job's parents' ids, in id order (NULL: a job enqueued without after=).
-- parents_left:      how many of them have not ended (a counter, decremented by each parent's end:
--                    two parents ending in concurrent transactions would each see the other
--                    unfinished in a recount).
-- on_parent_failure: 'cancel' (the default) or 'run': what a failed or cancelled parent does.
-- has_dependants:    set on a parent when a dependant is enqueued; it alone lets the trigger
--                    below run, so that plain jobs never call its function.
ALTER TABLE {schema}.jobs
    ADD COLUMN parents bigint[],
    ADD COLUMN parents_left integer CHECK (parents_left >= 0),
    ADD COLUMN on_parent_failure text CHECK (on_parent_failure IN ('cancel', 'run')),
    ADD COLUMN has_dependants boolean NOT NULL DEFAULT false;

-- The parent -> children lookup of the trigger (a child's parents are in its `parents`). Rows go
-- when their parent is pruned (jobs_prune.sql).
CREATE TABLE {schema}.job_dependencies (
    parent_id bigint NOT NULL,
    child_id  bigint NOT NULL,
    PRIMARY KEY (parent_id, child_id)
);

-- A parent's end releases its dependants: each child still parked and waiting counts the parent
-- as ended (parents_left - 1; at 0 it becomes due now). A parent that failed or was cancelled
-- cancels a child with on_parent_failure = 'cancel' instead (its own dependants follow through
-- this same trigger). Children are locked in id order, so that two parents ending at once never
-- deadlock on them. Runs for every path to a final state: outcomes, cancel, rescue, HTTP.
CREATE FUNCTION {schema}.release_dependants() RETURNS trigger LANGUAGE plpgsql AS $$
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
    SELECT count(pg_notify({jobs_channel}, json_build_object(
               'queue', q.queue, 'id', q.first_id, 'count', q.n,
               'types', CASE WHEN q.first_type = q.last_type
                             THEN json_build_array(q.first_type) END)::text))
    INTO v_woken
    FROM (SELECT queue, min(id) AS first_id, count(*) AS n,
                 min(type COLLATE "C") AS first_type, max(type COLLATE "C") AS last_type
          FROM released WHERE status = 'pending' AND parents_left = 0
          GROUP BY queue) AS q;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_release_dependants AFTER UPDATE OF status ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.has_dependants AND OLD.status <> NEW.status
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION {schema}.release_dependants();

-- Replaying a parent (failed or cancelled back to pending): its dependants that have not started
-- (still pending, attempts = 0) wait for it again (parents_left + 1, parked); those that ran or
-- run are left alone, and those it cancelled stay cancelled (replay them by id).
CREATE FUNCTION {schema}.repark_dependants() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH children AS (
        SELECT c.id
        FROM {schema}.job_dependencies AS d
        JOIN {schema}.jobs AS c ON c.id = d.child_id
        WHERE d.parent_id = NEW.id AND c.status = 'pending' AND c.attempts = 0
          AND c.parents IS NOT NULL
        ORDER BY c.id
        FOR UPDATE OF c
    )
    UPDATE {schema}.jobs AS c
    SET parents_left = c.parents_left + 1, run_at = 'infinity', updated_at = now()
    WHERE c.id = ANY(ARRAY(SELECT id FROM children));
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_repark_dependants AFTER UPDATE OF status ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.has_dependants AND NEW.status = 'pending'
          AND OLD.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION {schema}.repark_dependants();

-- Replaying a job that has parents recomputes what it waits for from its parents' current
-- statuses: parked until they end (a parent pruned since counts as ended).
CREATE FUNCTION {schema}.recount_parents() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SELECT count(*) INTO NEW.parents_left
    FROM {schema}.jobs AS p
    WHERE p.id = ANY(NEW.parents) AND p.status NOT IN ('completed', 'failed', 'cancelled');
    IF NEW.parents_left > 0 THEN
        NEW.run_at := 'infinity';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_recount_parents BEFORE UPDATE OF status ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.parents IS NOT NULL AND NEW.status = 'pending'
          AND OLD.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION {schema}.recount_parents();
