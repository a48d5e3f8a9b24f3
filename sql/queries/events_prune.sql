-- Forget up to $2 events emitted more than $1 seconds ago (the longest retention of finished
-- jobs), oldest first; how many went. Waits that took them keep their data.
WITH gone AS (
    DELETE FROM {schema}.events AS e
    WHERE e.id = ANY(ARRAY(SELECT id FROM {schema}.events
                           WHERE emitted_at < now() - make_interval(secs => $1::float8)
                           ORDER BY emitted_at
                           LIMIT $2))
    RETURNING 1
)
SELECT count(*) AS forgotten FROM gone
