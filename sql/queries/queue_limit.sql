-- Set the limits of queue $1, by $2, because $3 (NULL: no reason given): max_running becomes $5
-- when $4 (NULL: no limit), the rate $7 starts per $8 seconds when $6 (both NULL: no rate); a
-- limit not asked for is left as it is. Its controls row is created when it has none and a limit
-- is set. A change is logged in operator_log (action 'limit', detail: the limits before and
-- after), and wakes every worker of the queue when the transaction commits (a bare queue name on
-- the jobs channel, as resume sends): a looser limit lets them claim at once, a tighter one is
-- read by their next claim. Limits that already are so are left as they are and nothing is
-- logged or sent.
--
-- One row: the queue's controls after, `changed` and `known` (as queue_pause.sql, paused_at kept
-- within Python's years: _paused_at_clamped.sql). No row when a concurrent change created the queue's row
-- meanwhile: run it again, that row is visible then.
WITH {queue_current}, wanted AS (
    SELECT CASE WHEN $4::boolean THEN $5::integer ELSE o.max_running END AS max_running,
           CASE WHEN $6::boolean THEN $7::integer ELSE o.rate_limit END AS rate_limit,
           CASE WHEN $6::boolean THEN $8::integer ELSE o.rate_period END AS rate_period
    FROM (SELECT 1) AS one
    LEFT JOIN current AS o ON true
), updated AS (
    UPDATE {schema}.queues AS c
    SET max_running = w.max_running, rate_limit = w.rate_limit, rate_period = w.rate_period,
        updated_at = now()
    FROM current AS o, wanted AS w
    WHERE c.name = o.name
      AND (o.max_running, o.rate_limit, o.rate_period)
          IS DISTINCT FROM (w.max_running, w.rate_limit, w.rate_period)
    RETURNING {queue_controls}
), created AS (
    INSERT INTO {schema}.queues AS c (name, max_running, rate_limit, rate_period)
    SELECT $1::text, w.max_running, w.rate_limit, w.rate_period
    FROM wanted AS w
    WHERE NOT EXISTS (SELECT FROM current)
      AND (w.max_running IS NOT NULL OR w.rate_limit IS NOT NULL)
    ON CONFLICT (name) DO NOTHING
    RETURNING {queue_controls}
), changed AS (
    SELECT * FROM updated UNION ALL SELECT * FROM created
), logged AS (
    INSERT INTO {schema}.operator_log (actor, action, queue, reason, detail)
    SELECT $2::text, 'limit', n.name, $3::text,
           jsonb_build_object(
               'old', jsonb_build_object('max_running', o.max_running,
                                         'rate_limit', o.rate_limit,
                                         'rate_period', o.rate_period),
               'new', jsonb_build_object('max_running', n.max_running,
                                         'rate_limit', n.rate_limit,
                                         'rate_period', n.rate_period))
    FROM changed AS n
    LEFT JOIN current AS o ON true
), woken AS (
    SELECT pg_notify({jobs_channel}, n.name) FROM changed AS n
)
SELECT s.name,
       {paused_at_clamped} AS paused_at,
       s.paused_by, s.pause_reason, s.max_running, s.rate_limit, s.rate_period,
       (SELECT count(*) FROM woken) > 0 AS changed,
       {queue_known} AS known
FROM (
    SELECT * FROM changed
    UNION ALL
    SELECT * FROM current WHERE NOT EXISTS (SELECT FROM changed)
    UNION ALL
    -- No row, and none wanted (limits cleared on a queue that has none): nothing to write.
    SELECT $1::text, NULL::timestamptz, NULL::text, NULL::text, NULL::integer, NULL::integer,
           NULL::integer
    FROM wanted AS w
    WHERE NOT EXISTS (SELECT FROM current)
      AND w.max_running IS NULL AND w.rate_limit IS NULL
) AS s
