-- Age in seconds of the oldest due pending job, per queue.
SELECT queue, extract(epoch FROM now() - min(run_at))::float8 AS age
FROM {schema}.jobs
WHERE status = 'pending' AND run_at <= now()
GROUP BY queue
ORDER BY queue
