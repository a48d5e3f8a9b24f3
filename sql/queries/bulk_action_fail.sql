-- Bulk action $1 given up, saying why ($2): its batches done so far stay done.
UPDATE {schema}.bulk_actions
SET state = 'failed', error = $2::text, finished_at = now(), updated_at = now()
WHERE id = $1::bigint AND state = 'running'
