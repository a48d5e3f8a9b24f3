-- Running jobs past their lease (the overdue_jobs view): their worker stopped heartbeating and
-- the rescue has not taken them back yet; at most $1, most overdue first.
SELECT o.id, o.type, o.queue, o.worker_id, o.attempts, o.lease_expires_at,
       extract(epoch FROM o.overdue_by)::float8 AS overdue_by
FROM {schema}.overdue_jobs AS o
LIMIT $1
