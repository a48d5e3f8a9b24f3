-- What belongs to the jobs that CTE `gone` (id, has_dependants) deleted goes with them, in
-- retention (jobs_prune.sql) as in a bulk delete (jobs_delete_many.sql): a parent's links to its
-- dependants (only parents have any), the attempts, steps, milestones, events and event waits.
dependencies AS (
    DELETE FROM {schema}.job_dependencies AS d
    WHERE d.parent_id = ANY(ARRAY(SELECT id FROM gone WHERE has_dependants))
), attempts AS (
    DELETE FROM {schema}.job_attempts AS a WHERE a.job_id = ANY(ARRAY(SELECT id FROM gone))
), steps AS (
    DELETE FROM {schema}.job_steps AS s WHERE s.job_id = ANY(ARRAY(SELECT id FROM gone))
), milestones AS (
    DELETE FROM {schema}.job_milestones AS m WHERE m.job_id = ANY(ARRAY(SELECT id FROM gone))
), events AS (
    DELETE FROM {schema}.job_events AS e WHERE e.job_id = ANY(ARRAY(SELECT id FROM gone))
), waits AS (
    DELETE FROM {schema}.job_event_waits AS w WHERE w.job_id = ANY(ARRAY(SELECT id FROM gone))
)
