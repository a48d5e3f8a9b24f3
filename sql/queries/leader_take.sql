-- Take the maintenance leadership for worker $1, or renew it, for $2 seconds: a free or expired
-- lease is taken; a live one is renewed only by its holder. A row comes back when $1 leads.
INSERT INTO {schema}.leader AS l (name, worker_id, elected_at, expires_at)
VALUES ('maintenance', $1, now(), now() + make_interval(secs => $2::float8))
ON CONFLICT (name) DO UPDATE
SET worker_id = excluded.worker_id,
    elected_at = CASE WHEN l.worker_id = excluded.worker_id AND l.expires_at >= now()
                      THEN l.elected_at ELSE now() END,
    expires_at = excluded.expires_at
WHERE l.worker_id = excluded.worker_id OR l.expires_at < now()
RETURNING l.elected_at
