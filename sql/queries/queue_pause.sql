-- Pause queue $1, by $2, because $3 (NULL: no reason given), and log it in operator_log; its
-- controls row is created when it has none. A queue already paused is left as it is (its first
-- pause's who, when and why stand) and nothing is logged. The claims that start once this
-- commits leave the queue out (job_claim.sql): no worker needs waking.
--
-- One row: the queue's controls after, `changed` (this statement paused it) and `known` (before
-- it, a controls row, a pending job or a registered worker named the queue). No row when a
-- concurrent pause created the queue's row meanwhile: run it again, that row is visible then.
-- Times are kept within what Python's datetime holds (years 1 to 9999): a row written by hand
-- may hold 'infinity', '-infinity' or a year BC, which asyncpg cannot give as an aware
-- datetime: a pause of such a queue would fail instead of saying it is paused already.
WITH current AS (
    SELECT c.name, c.paused_at, c.paused_by, c.pause_reason,
           c.max_running, c.rate_limit, c.rate_period
    FROM {schema}.queues AS c
    WHERE c.name = $1
    FOR UPDATE
), updated AS (
    UPDATE {schema}.queues AS c
    SET paused_at = now(), paused_by = $2::text, pause_reason = $3::text, updated_at = now()
    FROM current AS o
    WHERE c.name = o.name AND o.paused_at IS NULL
    RETURNING c.name, c.paused_at, c.paused_by, c.pause_reason,
              c.max_running, c.rate_limit, c.rate_period
), created AS (
    INSERT INTO {schema}.queues AS c (name, paused_at, paused_by, pause_reason)
    SELECT $1::text, now(), $2::text, $3::text
    WHERE NOT EXISTS (SELECT FROM current)
    ON CONFLICT (name) DO NOTHING
    RETURNING c.name, c.paused_at, c.paused_by, c.pause_reason,
              c.max_running, c.rate_limit, c.rate_period
), changed AS (
    SELECT * FROM updated
    UNION ALL
    SELECT * FROM created
), logged AS (
    INSERT INTO {schema}.operator_log (actor, action, queue, reason)
    SELECT $2::text, 'pause', name, $3::text FROM changed
)
SELECT s.name,
       CASE WHEN s.paused_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'::timestamptz
            WHEN s.paused_at > '9999-12-31 23:59:59.999999+00'
            THEN '9999-12-31 23:59:59.999999+00'::timestamptz ELSE s.paused_at END AS paused_at,
       s.paused_by, s.pause_reason, s.max_running, s.rate_limit, s.rate_period, s.changed,
       EXISTS (SELECT FROM current)
       OR EXISTS (SELECT FROM {schema}.jobs AS j WHERE j.status = 'pending' AND j.queue = $1)
       OR EXISTS (SELECT FROM {schema}.workers AS w WHERE $1 = ANY (w.queues)) AS known
FROM (
    SELECT *, true AS changed FROM changed
    UNION ALL
    SELECT *, false FROM current WHERE NOT EXISTS (SELECT FROM changed)
) AS s
