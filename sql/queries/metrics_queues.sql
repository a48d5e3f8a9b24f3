-- The elected worker's queue gauges (pgworker_queue_jobs, pgworker_queue_oldest_pending_seconds,
-- pgworker_queue_paused, pgworker_queue_max_running): per queue, its jobs by status, the age in
-- seconds of its oldest due pending job (NULL when none is due), whether it is paused, and its
-- max_running (NULL: no limit). The first $1 queues by name:
-- queue names come from whoever enqueues.
WITH counts AS (
    SELECT queue, status, count(*) AS jobs
    FROM {schema}.jobs
    GROUP BY queue, status
), shown AS (
    SELECT DISTINCT queue FROM counts ORDER BY queue LIMIT $1
), due AS (
    -- Along jobs_claim_type_idx: one short index scan per queue.
    SELECT s.queue, extract(epoch FROM now() - o.run_at)::float8 AS oldest_pending_seconds
    FROM shown AS s
    CROSS JOIN LATERAL (
        SELECT min(j.run_at) AS run_at
        FROM {schema}.jobs AS j
        WHERE j.status = 'pending' AND j.queue = s.queue AND j.run_at <= now()
    ) AS o
)
SELECT c.queue, c.status, c.jobs, d.oldest_pending_seconds, p.paused_at IS NOT NULL AS paused,
       p.max_running
FROM counts AS c
JOIN due AS d ON d.queue = c.queue
LEFT JOIN {schema}.queues AS p ON p.name = c.queue
ORDER BY c.queue, c.status
