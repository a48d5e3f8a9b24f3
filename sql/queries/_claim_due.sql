-- The due jobs of one served (queue, type, version) `s`, in claim order, along
-- jobs_claim_type_idx (the plain claims; the caller adds its LIMIT and lock).
SELECT j.id, j.priority, j.run_at
FROM {schema}.jobs AS j
WHERE j.status = 'pending' AND j.queue = s.queue AND j.type = s.type
  AND j.version = s.version AND j.run_at <= now()
ORDER BY j.priority DESC, j.run_at, j.id
