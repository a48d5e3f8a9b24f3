-- The charts' attempts (issue 25, item 4): per bucket of $3 seconds (aligned on the epoch), the
-- attempts started from $1 to before $2, of queue $4 (NULL: every queue): how many completed,
-- how many failed (failed, timed out, retried, lost), the run time's p50 and p95 (ended
-- attempts), and the wait's p50 and p95 (claim − the run_at it was claimed at), in seconds.
-- Read along the BRIN index of job_attempts.started_at (one pass over the window's rows).
--
-- The counts are exact (a hash aggregate over the window's rows). The percentiles are taken over
-- a sample of at most about $5 attempts, so that their sorts and the probes below stay bounded
-- whatever the window holds: the attempts of one job in k (job_id % k = 0), k chosen from the
-- window's size; `sampled` is that k (1: every attempt). The wait needs the run_at the attempt
-- was claimed at, which only the job's latest attempt still has (a retry moves it): one probe of
-- jobs' primary key per sampled attempt, the wait of earlier attempts left out.
WITH window_rows AS MATERIALIZED (
    SELECT date_bin(make_interval(secs => $3::integer), a.started_at, 'epoch') AS bucket,
           a.job_id, a.attempt, a.outcome, a.started_at,
           date_part('epoch', a.finished_at - a.started_at) AS run
    FROM {schema}.job_attempts AS a
    WHERE a.started_at >= $1 AND a.started_at < $2 AND ($4::text IS NULL OR a.queue = $4)
), k AS (
    SELECT greatest(1, ceil(count(*)::float8 / $5::integer))::bigint AS k FROM window_rows
), counts AS (
    SELECT w.bucket,
           count(*) FILTER (WHERE w.outcome = 'completed') AS completed,
           count(*) FILTER (WHERE w.outcome IN ('failed', 'timed_out', 'retried', 'lost'))
               AS failed
    FROM window_rows AS w
    GROUP BY w.bucket
), sample AS MATERIALIZED (
    SELECT w.bucket, w.run,
           (SELECT greatest(date_part('epoch', w.started_at - j.run_at), 0)
            FROM {schema}.jobs AS j
            WHERE j.id = w.job_id AND j.attempts = w.attempt AND j.status <> 'pending') AS wait
    FROM window_rows AS w
    CROSS JOIN k
    WHERE w.job_id % k.k = 0
), percentiles AS (
    SELECT s.bucket,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY s.run) AS run_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY s.run) AS run_p95,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY s.wait) AS wait_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY s.wait) AS wait_p95
    FROM sample AS s
    GROUP BY s.bucket
)
SELECT c.bucket, c.completed, c.failed, p.run_p50, p.run_p95, p.wait_p50, p.wait_p95,
       (SELECT k.k FROM k) AS sampled
FROM counts AS c
LEFT JOIN percentiles AS p ON p.bucket = c.bucket
ORDER BY c.bucket
