-- The controls of every queue that has a row, by name (a NULL paused_at: not paused). Counts
-- nothing: for pages that count the jobs already (GET /queues, the dashboard's queues page).
SELECT c.name, c.paused_at, c.paused_by, c.pause_reason
FROM {schema}.queues AS c
ORDER BY c.name
