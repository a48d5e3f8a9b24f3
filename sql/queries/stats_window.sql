-- The console's charts' numbers: per bucket of $3 seconds (aligned on the epoch) of the
-- minutes from $1 to $2, of queue $4 and type $5 ('': every one), the jobs enqueued, the
-- attempts started that completed and failed (failed, timed out, retried, lost), and the
-- histograms of their wait and run times (buckets and counts, ascending; min and max).
--
-- Minutes rolled up (stats_rollup, migration 24) are read from stats_minutes: one range of its
-- primary key, at most 1,440 rows for a day. Of the newest $6 minutes, those not rolled up yet
-- (the last two or three; all of them before the rollup ran) and those rolled up while some of
-- their attempts were running are computed here from job_attempts and jobs instead, from the
-- fragments stats_rollup.sql computes them with, along one range of the BRIN indexes of
-- started_at and created_at from the oldest of them: its cost is that of the attempts since.
-- Older minutes not rolled up are left out: `unread` counts them (0: every minute counted); a
-- row with a NULL bucket carries it when nothing was found.
WITH minutes AS MATERIALIZED (
    -- running: NULL for a minute not rolled up.
    SELECT m.minute, r.running
    FROM generate_series($1::timestamptz, $2::timestamptz, interval '1 minute') AS m(minute)
    LEFT JOIN {schema}.stats_rollup AS r ON r.minute = m.minute
), direct AS MATERIALIZED (
    SELECT m.minute
    FROM minutes AS m
    WHERE (m.running IS NULL OR m.running > 0)
      AND m.minute > $2::timestamptz - make_interval(mins => $6::integer)
), span AS (
    SELECT min(d.minute) AS low, max(d.minute) + interval '1 minute' AS high FROM direct AS d
), unread AS (
    SELECT count(*) AS unread
    FROM minutes AS m
    WHERE m.running IS NULL AND m.minute NOT IN (SELECT d.minute FROM direct AS d)
), raw AS MATERIALIZED (
    -- One range of the BRIN index, from the oldest minute read here to the newest.
    SELECT date_bin(interval '1 minute', a.started_at, 'epoch') AS minute, a.outcome,
           {attempt_times}
    FROM {schema}.job_attempts AS a
    WHERE a.started_at >= (SELECT low FROM span) AND a.started_at < (SELECT high FROM span)
      AND ($4::text = '' OR a.queue = $4::text) AND ($5::text = '' OR a.type = $5::text)
      AND date_bin(interval '1 minute', a.started_at, 'epoch') IN (SELECT minute FROM direct)
), attempts AS MATERIALIZED (
    SELECT r.minute, r.outcome, r.wait, r.run,
           {time_buckets}
    FROM raw AS r
), rolled AS MATERIALIZED (
    SELECT s.*
    FROM {schema}.stats_minutes AS s
    WHERE s.queue = $4::text AND s.type = $5::text
      AND s.minute >= $1::timestamptz AND s.minute <= $2::timestamptz
      AND s.minute NOT IN (SELECT d.minute FROM direct AS d)
), counts AS (
    SELECT date_bin(make_interval(secs => $3::integer), c.minute, 'epoch') AS bucket,
           sum(c.enqueued)::bigint AS enqueued, sum(c.completed)::bigint AS completed,
           sum(c.failed)::bigint AS failed, min(c.wait_min) AS wait_min,
           max(c.wait_max) AS wait_max, min(c.run_min) AS run_min, max(c.run_max) AS run_max
    FROM (
        SELECT r.minute, r.enqueued, r.completed, r.failed, r.wait_min, r.wait_max, r.run_min,
               r.run_max
        FROM rolled AS r
        UNION ALL
        SELECT a.minute, 0, count(*) FILTER (WHERE a.outcome = 'completed'),
               count(*) FILTER (WHERE a.outcome IN ('failed', 'timed_out', 'retried', 'lost')),
               min(a.wait), max(a.wait), min(a.run), max(a.run)
        FROM attempts AS a
        GROUP BY a.minute
        UNION ALL
        SELECT date_bin(interval '1 minute', j.created_at, 'epoch'), 1, 0, 0, NULL, NULL, NULL,
               NULL
        FROM {schema}.jobs AS j
        WHERE j.created_at >= (SELECT low FROM span) AND j.created_at < (SELECT high FROM span)
          AND ($4::text = '' OR j.queue = $4::text) AND ($5::text = '' OR j.type = $5::text)
          AND date_bin(interval '1 minute', j.created_at, 'epoch') IN (SELECT minute FROM direct)
    ) AS c
    GROUP BY 1
), histograms AS (
    SELECT h.bucket, h.kind, array_agg(h.b ORDER BY h.b) AS buckets,
           array_agg(h.n ORDER BY h.b) AS counts
    FROM (
        SELECT date_bin(make_interval(secs => $3::integer), x.minute, 'epoch') AS bucket,
               x.kind, x.b, sum(x.n)::bigint AS n
        FROM (
            SELECT r.minute, 'wait' AS kind, u.b, u.n
            FROM rolled AS r CROSS JOIN LATERAL unnest(r.wait_buckets, r.wait_counts) AS u(b, n)
            UNION ALL
            SELECT r.minute, 'run', u.b, u.n
            FROM rolled AS r CROSS JOIN LATERAL unnest(r.run_buckets, r.run_counts) AS u(b, n)
            UNION ALL
            SELECT a.minute, 'wait', a.wb, 1 FROM attempts AS a WHERE a.wb IS NOT NULL
            UNION ALL
            SELECT a.minute, 'run', a.rb, 1 FROM attempts AS a WHERE a.rb IS NOT NULL
        ) AS x
        GROUP BY 1, 2, 3
    ) AS h
    GROUP BY h.bucket, h.kind
)
SELECT c.bucket, c.enqueued, c.completed, c.failed, c.wait_min, c.wait_max, c.run_min,
       c.run_max, w.buckets AS wait_buckets, w.counts AS wait_counts,
       r.buckets AS run_buckets, r.counts AS run_counts, u.unread
FROM unread AS u
LEFT JOIN counts AS c ON true
LEFT JOIN histograms AS w ON w.bucket = c.bucket AND w.kind = 'wait'
LEFT JOIN histograms AS r ON r.bucket = c.bucket AND r.kind = 'run'
ORDER BY c.bucket
