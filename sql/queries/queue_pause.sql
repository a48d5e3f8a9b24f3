-- Pause queue $1, by $2, because $3 (NULL: no reason given), and log it in operator_log; its
-- controls row is created when it has none. A queue already paused is left as it is (its first
-- pause's who, when and why stand) and nothing is logged. The claims that start once this
-- commits leave the queue out (job_claim.sql): no worker needs waking.
--
-- One row: the queue's controls after, `changed` (this statement paused it) and `known` (before
-- it, a controls row, a pending job or a registered worker named the queue). No row when a
-- concurrent pause created the queue's row meanwhile: run it again, that row is visible then.
-- paused_at is kept within Python's years (_paused_at_clamped.sql): a pause of a queue paused
-- 'infinity' by hand says it is paused already.
WITH {queue_current}, updated AS (
    UPDATE {schema}.queues AS c
    SET paused_at = now(), paused_by = $2::text, pause_reason = $3::text, updated_at = now()
    FROM current AS o
    WHERE c.name = o.name AND o.paused_at IS NULL
    RETURNING {queue_controls}
), created AS (
    INSERT INTO {schema}.queues AS c (name, paused_at, paused_by, pause_reason)
    SELECT $1::text, now(), $2::text, $3::text
    WHERE NOT EXISTS (SELECT FROM current)
    ON CONFLICT (name) DO NOTHING
    RETURNING {queue_controls}
), changed AS (
    SELECT * FROM updated UNION ALL SELECT * FROM created
), logged AS (
    INSERT INTO {schema}.operator_log (actor, action, queue, reason)
    SELECT $2::text, 'pause', name, $3::text FROM changed
)
SELECT s.name,
       {paused_at_clamped} AS paused_at,
       s.paused_by, s.pause_reason, s.max_running, s.rate_limit, s.rate_period, s.changed,
       {queue_known} AS known
FROM (
    SELECT *, true AS changed FROM changed
    UNION ALL
    SELECT *, false FROM current WHERE NOT EXISTS (SELECT FROM changed)
) AS s
