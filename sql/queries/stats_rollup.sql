-- Roll up minute $1 (its start, aligned on the epoch) into stats_minutes (migration 24): the
-- whole minute recomputed from job_attempts and jobs and written over what was there, so that
-- rolling a minute up twice (a crash, a second leader) never counts anything twice. With $2,
-- the leader's worker id, nothing is written unless that worker still holds a live maintenance
-- lease (the fence of jobs_prune.sql). Returns the attempts read and the rows written.
--
-- The minute's attempts (those started in it) are read along the BRIN index of
-- job_attempts.started_at, its jobs enqueued along that of jobs.created_at; an attempt written
-- before migration 23 needs one probe of jobs' primary key for its wait: the cost is linear in
-- the minute's traffic. The numbers are those stats_window.sql computes for the minutes it reads
-- directly, from the same fragments: the completed and failed attempts, the run and wait times
-- (_attempt_times.sql) and their histogram buckets (_time_buckets.sql). Each attempt and job is
-- counted under its (queue, type), its queue (type ''), its type (queue '') and the whole
-- ('', '').
WITH fence AS (
    SELECT $2::text IS NULL
           OR EXISTS (SELECT FROM {schema}.leader
                      WHERE name = 'maintenance' AND worker_id = $2::text
                        AND expires_at > now()) AS held
), raw AS MATERIALIZED (
    SELECT a.queue, a.type, a.outcome,
           {attempt_times}
    FROM {schema}.job_attempts AS a
    WHERE a.started_at >= $1::timestamptz AND a.started_at < $1::timestamptz + interval '1 minute'
      AND (SELECT held FROM fence)
), attempts AS MATERIALIZED (
    SELECT r.queue, r.type, r.outcome, r.wait, r.run,
           {time_buckets}
    FROM raw AS r
), expanded AS MATERIALIZED (
    SELECT g.queue, g.type, a.outcome, a.wait, a.run, a.wb, a.rb
    FROM attempts AS a
    CROSS JOIN LATERAL (VALUES (a.queue, a.type), (a.queue, ''), ('', a.type), ('', ''))
        AS g(queue, type)
), enqueued AS (
    SELECT g.queue, g.type, count(*)::integer AS enqueued
    FROM {schema}.jobs AS j
    CROSS JOIN LATERAL (VALUES (j.queue, j.type), (j.queue, ''), ('', j.type), ('', ''))
        AS g(queue, type)
    WHERE j.created_at >= $1::timestamptz AND j.created_at < $1::timestamptz + interval '1 minute'
      AND (SELECT held FROM fence)
    GROUP BY g.queue, g.type
), counts AS (
    SELECT e.queue, e.type,
           count(*) FILTER (WHERE e.outcome = 'completed')::integer AS completed,
           count(*) FILTER (WHERE e.outcome IN ('failed', 'timed_out', 'retried', 'lost'))::integer
               AS failed,
           min(e.wait) AS wait_min, max(e.wait) AS wait_max,
           min(e.run) AS run_min, max(e.run) AS run_max
    FROM expanded AS e
    GROUP BY e.queue, e.type
), histograms AS (
    SELECT h.queue, h.type, h.kind, array_agg(h.b ORDER BY h.b) AS buckets,
           array_agg(h.n ORDER BY h.b) AS counts
    FROM (SELECT e.queue, e.type, x.kind, x.b, count(*)::integer AS n
          FROM expanded AS e
          CROSS JOIN LATERAL (VALUES ('wait', e.wb), ('run', e.rb)) AS x(kind, b)
          WHERE x.b IS NOT NULL
          GROUP BY e.queue, e.type, x.kind, x.b) AS h
    GROUP BY h.queue, h.type, h.kind
), fresh AS MATERIALIZED (
    SELECT k.queue, k.type, coalesce(q.enqueued, 0) AS enqueued,
           coalesce(c.completed, 0) AS completed, coalesce(c.failed, 0) AS failed,
           c.wait_min, c.wait_max, c.run_min, c.run_max,
           coalesce(w.buckets, '{}') AS wait_buckets, coalesce(w.counts, '{}') AS wait_counts,
           coalesce(r.buckets, '{}') AS run_buckets, coalesce(r.counts, '{}') AS run_counts
    FROM (SELECT queue, type FROM counts UNION SELECT queue, type FROM enqueued) AS k
    LEFT JOIN counts AS c ON c.queue = k.queue AND c.type = k.type
    LEFT JOIN enqueued AS q ON q.queue = k.queue AND q.type = k.type
    LEFT JOIN histograms AS w ON w.queue = k.queue AND w.type = k.type AND w.kind = 'wait'
    LEFT JOIN histograms AS r ON r.queue = k.queue AND r.type = k.type AND r.kind = 'run'
), written AS (
    INSERT INTO {schema}.stats_minutes AS s
        (queue, type, minute, enqueued, completed, failed, wait_min, wait_max, run_min, run_max,
         wait_buckets, wait_counts, run_buckets, run_counts)
    SELECT f.queue, f.type, $1::timestamptz, f.enqueued, f.completed, f.failed, f.wait_min,
           f.wait_max, f.run_min, f.run_max, f.wait_buckets, f.wait_counts, f.run_buckets,
           f.run_counts
    FROM fresh AS f
    ON CONFLICT (queue, type, minute) DO UPDATE
    SET enqueued = excluded.enqueued, completed = excluded.completed, failed = excluded.failed,
        wait_min = excluded.wait_min, wait_max = excluded.wait_max,
        run_min = excluded.run_min, run_max = excluded.run_max,
        wait_buckets = excluded.wait_buckets, wait_counts = excluded.wait_counts,
        run_buckets = excluded.run_buckets, run_counts = excluded.run_counts
    RETURNING 1
), stale AS (
    -- Rows of a (queue, type) the minute no longer has (its jobs were deleted since).
    DELETE FROM {schema}.stats_minutes AS s
    WHERE s.minute = $1::timestamptz AND (SELECT held FROM fence)
      AND NOT EXISTS (SELECT FROM fresh AS f WHERE f.queue = s.queue AND f.type = s.type)
), marked AS (
    INSERT INTO {schema}.stats_rollup AS r (minute, rolled_at, running)
    SELECT $1::timestamptz, now(),
           (SELECT count(*) FROM attempts AS a WHERE a.outcome = 'running')
    WHERE (SELECT held FROM fence)
    ON CONFLICT (minute) DO UPDATE SET rolled_at = excluded.rolled_at, running = excluded.running
)
SELECT (SELECT count(*) FROM attempts) AS attempts, (SELECT count(*) FROM written) AS written
