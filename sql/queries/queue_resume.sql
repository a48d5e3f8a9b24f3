-- Resume queue $1, by $2, because $3 (NULL: no reason given): its pause is cleared and logged in
-- operator_log with the pause it ended (when, by whom, why), and every worker of the queue is
-- woken when the transaction commits (a bare queue name on the jobs channel: all of them claim,
-- as after a poll that finds a backlog). A queue not paused (or without a controls row) is left
-- as it is and nothing is logged. The controls row stays (other controls may live on it).
--
-- One row: the queue's controls after, `changed` (this statement resumed it) and `known` (a
-- controls row, a pending job or a registered worker names the queue).
-- Times are kept within what Python's datetime holds (years 1 to 9999): a row written by hand
-- may hold 'infinity', '-infinity' or a year BC, which asyncpg cannot give as an aware
-- datetime: the statement would fail, and such a queue could never be resumed.
WITH current AS (
    SELECT c.name, c.paused_at, c.paused_by, c.pause_reason,
           c.max_running, c.rate_limit, c.rate_period
    FROM {schema}.queues AS c
    WHERE c.name = $1
    FOR UPDATE
), resumed AS (
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
       CASE WHEN EXISTS (SELECT FROM resumed) THEN NULL
            WHEN o.paused_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'::timestamptz
            WHEN o.paused_at > '9999-12-31 23:59:59.999999+00'
            THEN '9999-12-31 23:59:59.999999+00'::timestamptz
            ELSE o.paused_at END AS paused_at,
       CASE WHEN EXISTS (SELECT FROM resumed) THEN NULL ELSE o.paused_by END AS paused_by,
       CASE WHEN EXISTS (SELECT FROM resumed) THEN NULL ELSE o.pause_reason END AS pause_reason,
       o.max_running, o.rate_limit, o.rate_period,
       (SELECT count(*) FROM woken) > 0 AS changed,
       EXISTS (SELECT FROM current)
       OR EXISTS (SELECT FROM {schema}.jobs AS j WHERE j.status = 'pending' AND j.queue = $1)
       OR EXISTS (SELECT FROM {schema}.workers AS w WHERE $1 = ANY (w.queues)) AS known
FROM (SELECT 1) AS one
LEFT JOIN current AS o ON true
