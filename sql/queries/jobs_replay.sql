-- Replay jobs $1: those failed or cancelled go back to pending now, with a fresh set of retries
-- and a fresh retry-time budget, their error and cancel request cleared. `attempts` is kept, so
-- the next attempt is numbered after the last one and the attempts' history stays whole. Each
-- replay is recorded in job_events (actor $2, reason $3, and the bulk action $4 when one replays
-- them: NULL for a replay by id), and the workers of their queues are woken when the transaction
-- commits. Returns one row per job found, with the status it had and
-- whether it was replayed; the other jobs are left as they are. A job whose unique key (migration
-- 17) is now held by another live job of its bucket, and whose own unique states do not hold its
-- failed or cancelled status, would collide with it once pending: it is left as it is, and
-- `held_by` names the holder. A dependant (migration 19) counts its parents not ended again, and
-- waits for them, parked, if any is left (a recount here rather than a trigger on every update
-- of `status`: see migration 26).
WITH target AS (
    SELECT j.id, j.status,
           CASE WHEN j.unique_key IS NOT NULL
                     AND NOT {schema}.unique_state_in(j.unique_states, j.status) THEN (
               SELECT h.id FROM {schema}.jobs AS h
               WHERE h.queue = j.queue AND h.type = j.type AND h.unique_key = j.unique_key
                 AND h.unique_bucket = j.unique_bucket AND h.id <> j.id
                 AND h.unique_key IS NOT NULL
                 AND {schema}.unique_state_in(h.unique_states, h.status)
           ) END AS held_by,
           CASE WHEN j.parents IS NOT NULL THEN (
               SELECT count(*) FROM {schema}.jobs AS p
               WHERE p.id = ANY(j.parents)
                 AND p.status NOT IN ('completed', 'failed', 'cancelled')
           ) END AS parents_left
    FROM {schema}.jobs AS j
    WHERE j.id = ANY($1::bigint[])
    ORDER BY j.id
    FOR UPDATE
), replayed AS (
    UPDATE {schema}.jobs AS j
    SET status = 'pending',
        retry_count = 0,
        error = NULL,
        error_group = NULL,
        budget_started_at = NULL,
        cancel_requested_at = NULL,
        finished_at = NULL,
        lease_expires_at = NULL,
        parents_left = coalesce(t.parents_left, j.parents_left),
        run_at = CASE WHEN t.parents_left > 0 THEN 'infinity' ELSE now() END,
        updated_at = now()
    FROM target AS t
    WHERE j.id = t.id AND t.status IN ('failed', 'cancelled') AND t.held_by IS NULL
    RETURNING j.id, j.type, j.queue, j.attempts, j.correlation_id
), recorded AS (
    INSERT INTO {schema}.job_events (job_id, kind, actor, reason, detail)
    SELECT r.id, 'replayed', $2::text, $3::text,
           jsonb_strip_nulls(jsonb_build_object('previous_status', t.status,
                                                'attempts', r.attempts,
                                                'bulk_action', $4::bigint))
    FROM replayed AS r
    JOIN target AS t ON t.id = r.id
), woken AS (
    SELECT pg_notify({jobs_channel}, q.queue)
    FROM (SELECT DISTINCT queue FROM replayed) AS q
)
SELECT t.id, t.status AS previous, r.id IS NOT NULL AS replayed, t.held_by, r.type, r.queue, r.attempts,
       r.correlation_id, (SELECT count(*) FROM woken) AS queues_woken
FROM target AS t
LEFT JOIN replayed AS r ON r.id = t.id
ORDER BY t.id
