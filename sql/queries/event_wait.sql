-- Wait number $4 of job $1 for an event named $5, with a timeout of $6 seconds (NULL: none), run
-- after event_lock.sql in the same transaction. Fenced by the attempt: only while job $1 is still
-- running attempt $2 claimed at $3 (its row locked FOR SHARE until the transaction ends).
--
-- A wait already delivered or timed out is returned as it is (a later attempt resuming). Else
-- it takes the oldest event of its name emitted since the job was enqueued that the job has not
-- consumed yet; without one, it is timed out once its deadline (set when first recorded) passed,
-- else recorded undelivered. One row: `held` (false: the attempt lost its job, nothing written),
-- and the wait as it stands, with `delay`, the seconds left until its deadline (NULL: none).
WITH held AS (
    SELECT j.id, j.created_at
    FROM {schema}.jobs AS j
    WHERE j.id = $1 AND j.status = 'running' AND j.attempts = $2 AND j.claimed_at = $3
    FOR SHARE OF j
), existing AS (
    SELECT w.name, w.deadline, w.event_id, w.data, w.timed_out
    FROM {schema}.job_event_waits AS w
    WHERE w.job_id = (SELECT id FROM held) AND w.seq = $4
), open AS (
    SELECT h.id, h.created_at,
           CASE WHEN EXISTS (SELECT FROM existing) THEN (SELECT deadline FROM existing)
                ELSE now() + make_interval(secs => $6::float8) END AS deadline
    FROM held AS h
    WHERE NOT EXISTS (SELECT FROM existing AS e
                      WHERE e.event_id IS NOT NULL OR e.timed_out OR e.name <> $5::text)
), candidate AS (
    SELECT e.id, e.data
    FROM open AS o
    JOIN {schema}.events AS e ON e.name = $5::text AND e.emitted_at >= o.created_at
    WHERE NOT EXISTS (SELECT FROM {schema}.job_event_waits AS c
                      WHERE c.job_id = o.id AND c.event_id = e.id)
    ORDER BY e.emitted_at, e.id
    LIMIT 1
), written AS (
    INSERT INTO {schema}.job_event_waits AS w
        (job_id, seq, name, deadline, event_id, data, timed_out, attempt, delivered_at)
    SELECT o.id, $4, $5::text, o.deadline, c.id, c.data,
           c.id IS NULL AND coalesce(o.deadline <= now(), false), $2,
           CASE WHEN c.id IS NOT NULL THEN clock_timestamp() END
    FROM open AS o
    LEFT JOIN candidate AS c ON true
    ON CONFLICT (job_id, seq) DO UPDATE
        SET event_id = excluded.event_id, data = excluded.data, timed_out = excluded.timed_out,
            delivered_at = excluded.delivered_at
    RETURNING w.name, w.deadline, w.event_id, w.data, w.timed_out
), now_is AS (
    SELECT * FROM written
    UNION ALL
    SELECT * FROM existing WHERE NOT EXISTS (SELECT FROM written)
)
SELECT EXISTS (SELECT FROM held) AS held, n.name, n.deadline, n.event_id IS NOT NULL AS delivered,
       n.data::text AS data, n.timed_out,
       extract(epoch FROM n.deadline - now())::float8 AS delay
FROM (SELECT 1) AS one
LEFT JOIN now_is AS n ON EXISTS (SELECT FROM held)
