j.id, j.type, j.queue, j.payload::text AS payload, j.priority, j.status, j.retry_count,
j.max_retries, j.attempts, j.idempotency_key, j.correlation_id, j.run_at, j.claimed_at,
j.worker_id, j.lease_expires_at, j.error, j.progress::text AS progress, j.result::text AS result,
j.created_at, j.updated_at, j.finished_at
