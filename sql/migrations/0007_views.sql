-- Dashboard views: what an operator's panels read, over `jobs`, `job_attempts` and `workers`.
-- Each reads through an index the hot path already keeps (no index is added here): the BRIN on
-- job_attempts.started_at, and jobs_claim_idx, jobs_lease_idx and jobs_finished_idx on jobs.
-- A view takes no parameters, so type_stats covers a fixed window: the attempts started in the
-- last hour.

-- Per job type, the attempts started in the last hour: how many, how they ended, the failure
-- rate (failed, timed out and retried among those that ended) and the run time of the ended
-- ones, in seconds. Attempts still running count in `attempts` only.
CREATE VIEW {schema}.type_stats AS
SELECT a.type,
       count(*) AS attempts,
       count(*) FILTER (WHERE a.outcome = 'running') AS running,
       count(*) FILTER (WHERE a.outcome = 'completed') AS completed,
       count(*) FILTER (WHERE a.outcome = 'failed') AS failed,
       count(*) FILTER (WHERE a.outcome = 'timed_out') AS timed_out,
       count(*) FILTER (WHERE a.outcome = 'retried') AS retried,
       (count(*) FILTER (WHERE a.outcome IN ('failed', 'timed_out', 'retried')))::float8
           / nullif(count(*) FILTER (WHERE a.outcome <> 'running'), 0) AS failure_rate,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.finished_at - a.started_at))
           FILTER (WHERE a.finished_at IS NOT NULL) AS p50_seconds,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM a.finished_at - a.started_at))
           FILTER (WHERE a.finished_at IS NOT NULL) AS p95_seconds
FROM {schema}.job_attempts AS a
WHERE a.started_at > now() - interval '1 hour'
GROUP BY a.type;

-- The last 100 failed jobs, newest failure first (read backwards along jobs_finished_idx).
CREATE VIEW {schema}.recent_failures AS
SELECT j.id, j.type, j.queue, j.correlation_id, j.attempts, j.error, j.finished_at
FROM {schema}.jobs AS j
WHERE j.finished_at IS NOT NULL AND j.status = 'failed'
ORDER BY j.finished_at DESC, j.id DESC
LIMIT 100;

-- Running jobs whose lease has expired: their worker stopped heartbeating (frozen, crashed, cut
-- off) and the leader's rescue has not taken them back yet. Most overdue first.
CREATE VIEW {schema}.overdue_jobs AS
SELECT j.id, j.type, j.queue, j.worker_id, j.attempts, j.lease_expires_at, j.heartbeat_at,
       now() - j.lease_expires_at AS overdue_by
FROM {schema}.jobs AS j
WHERE j.lease_expires_at IS NOT NULL AND j.lease_expires_at < now() AND j.status = 'running'
ORDER BY j.lease_expires_at, j.id;

-- Per queue, the pending jobs that are due (run_at reached): how many, and how long the oldest
-- has waited. A queue with nothing due has no row.
CREATE VIEW {schema}.queue_backlog AS
SELECT j.queue,
       count(*) AS pending_due,
       min(j.run_at) AS oldest_run_at,
       now() - min(j.run_at) AS oldest_age
FROM {schema}.jobs AS j
WHERE j.status = 'pending' AND j.run_at <= now()
GROUP BY j.queue;

-- Registered workers, when each was last seen (its heartbeat), and the ids of the jobs it runs
-- (running jobs hold a lease, so they are read along jobs_lease_idx). A worker that crashed
-- stays listed, its `seen_ago` growing, until the leader forgets it.
CREATE VIEW {schema}.worker_activity AS
SELECT w.worker_id, w.hostname, w.pid, w.queues, w.types, w.concurrency, w.started_at,
       w.last_seen_at,
       now() - w.last_seen_at AS seen_ago,
       coalesce(r.job_ids, '{}') AS running_job_ids
FROM {schema}.workers AS w
LEFT JOIN (
    SELECT j.worker_id, array_agg(j.id ORDER BY j.id) AS job_ids
    FROM {schema}.jobs AS j
    WHERE j.lease_expires_at IS NOT NULL AND j.status = 'running'
    GROUP BY j.worker_id
) AS r ON r.worker_id = w.worker_id;
