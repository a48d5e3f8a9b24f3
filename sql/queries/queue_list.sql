-- Every queue that a job names or that has a controls row, by name: its pause (NULL columns:
-- not paused) and its pending and running jobs. It counts the whole of jobs, as status_counts.
WITH counts AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'running') AS running
    FROM {schema}.jobs
    GROUP BY queue
)
SELECT coalesce(c.name, n.queue) AS name, c.paused_at, c.paused_by, c.pause_reason,
       coalesce(n.pending, 0) AS pending, coalesce(n.running, 0) AS running
FROM counts AS n
FULL JOIN {schema}.queues AS c ON c.name = n.queue
ORDER BY 1
