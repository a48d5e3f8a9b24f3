-- Jobs whose lease expired, but those in $1 (rows the rescue could not write), oldest first: what
-- the rescue takes one by one when the database refuses its batch.
SELECT id
FROM {schema}.jobs
WHERE status = 'running' AND lease_expires_at < now() AND NOT (id = ANY($1::bigint[]))
ORDER BY lease_expires_at
LIMIT 1000
