-- The upsert of the leader row `l` a worker inserts: a free or expired lease is taken; a live
-- one is renewed only by its holder, who keeps its elected_at.
ON CONFLICT (name) DO UPDATE
SET worker_id = excluded.worker_id,
    elected_at = CASE WHEN l.worker_id = excluded.worker_id AND l.expires_at >= now()
                      THEN l.elected_at ELSE now() END,
    expires_at = excluded.expires_at
WHERE l.worker_id = excluded.worker_id OR l.expires_at < now()
