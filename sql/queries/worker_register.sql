-- Register worker $1 (host $2, process $3) serving queues $4 and types $5 with $6 slots and a
-- lease of $7 seconds, calling the pooled functions $8 ('{}': none, a direct worker). A worker id
-- seen before (a restart) takes its row over.
INSERT INTO {schema}.workers (worker_id, hostname, pid, queues, types, concurrency, lease,
                              functions)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text[])
ON CONFLICT (worker_id) DO UPDATE
SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
    types = EXCLUDED.types, concurrency = EXCLUDED.concurrency, lease = EXCLUDED.lease,
    functions = EXCLUDED.functions, http = false, last_seen_at = now()
