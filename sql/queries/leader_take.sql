-- Take the maintenance leadership for worker $1, or renew it, for $2 seconds: a free or expired
-- lease is taken; a live one is renewed only by its holder. A row comes back when $1 leads.
INSERT INTO {schema}.leader AS l (name, worker_id, elected_at, expires_at)
VALUES ('maintenance', $1, now(), now() + make_interval(secs => $2::float8))
{lease_taken}
RETURNING l.elected_at
