-- Resume queue $1, by $2, because $3 (NULL: no reason given): its pause is cleared and logged in
-- operator_log with the pause it ended (when, by whom, why), and every worker of the queue is
-- woken when the transaction commits (a bare queue name on the jobs channel: all of them claim,
-- as after a poll that finds a backlog). A queue not paused (or without a controls row) is left
-- as it is and nothing is logged. The controls row stays (other controls may live on it).
--
-- One row: the queue's controls after, `changed` (this statement resumed it) and `known` (a
-- controls row, a pending job or a registered worker names the queue). paused_at is kept within
-- Python's years (_paused_at_clamped.sql): a queue paused 'infinity' by hand can be resumed.
WITH {queue_current}, resumed AS (
    UPDATE {schema}.queues AS c
    SET paused_at = NULL, paused_by = NULL, pause_reason = NULL, updated_at = now()
    FROM current AS o
    WHERE c.name = o.name AND o.paused_at IS NOT NULL
    RETURNING c.name
), logged AS (
    INSERT INTO {schema}.operator_log (actor, action, queue, reason, detail)
    SELECT $2::text, 'resume', o.name, $3::text,
           jsonb_build_object('paused_at', o.paused_at, 'paused_by', o.paused_by,
                              'pause_reason', o.pause_reason)
    FROM current AS o
    JOIN resumed AS r ON r.name = o.name
), woken AS (
    SELECT pg_notify({jobs_channel}, r.name) FROM resumed AS r
)
SELECT $1::text AS name,
       CASE WHEN EXISTS (SELECT FROM resumed) THEN NULL ELSE {paused_at_clamped} END AS paused_at,
       CASE WHEN EXISTS (SELECT FROM resumed) THEN NULL ELSE s.paused_by END AS paused_by,
       CASE WHEN EXISTS (SELECT FROM resumed) THEN NULL ELSE s.pause_reason END AS pause_reason,
       s.max_running, s.rate_limit, s.rate_period,
       (SELECT count(*) FROM woken) > 0 AS changed,
       {queue_known} AS known
FROM (SELECT 1) AS one
LEFT JOIN current AS s ON true
