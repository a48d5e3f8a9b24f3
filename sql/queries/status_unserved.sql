-- Pending (queue, type) pairs that no worker seen in the last $1 seconds serves.
SELECT DISTINCT j.queue, j.type
FROM {schema}.jobs AS j
WHERE j.status = 'pending'
  AND NOT EXISTS (
      SELECT FROM {schema}.workers AS w
      WHERE w.last_seen_at > now() - make_interval(secs => $1::float8)
        AND j.queue = ANY(w.queues) AND j.type = ANY(w.types))
ORDER BY j.queue, j.type
