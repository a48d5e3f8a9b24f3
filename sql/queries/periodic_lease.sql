-- Take the lease $3 ('periodic:' and the hash of a schedule set) for worker $1, or renew it, for
-- $2 seconds, as leader_take.sql does for maintenance; returns the database's clock when $1 holds
-- it (the leader computes slots on that clock), no row otherwise. Leases of schedule sets that no
-- worker has renewed for a day (older deploys) are deleted on the way.
WITH stale AS (
    DELETE FROM {schema}.leader
    WHERE name LIKE 'periodic:%' AND name <> $3 AND expires_at < now() - interval '1 day'
)
INSERT INTO {schema}.leader AS l (name, worker_id, elected_at, expires_at)
VALUES ($3, $1, now(), now() + make_interval(secs => $2::float8))
{lease_taken}
RETURNING now() AS now
