-- Bound every statement of one request of `pgworker serve`: $1 milliseconds waiting on a lock, $2
-- running, for the rest of its transaction only (set_config's `true`: SET LOCAL). Set inside the
-- transaction rather than as a startup parameter or a session SET: a transaction pooler
-- (PgBouncer in transaction mode) refuses the one and loses the other.
SELECT set_config('lock_timeout', $1::text, true), set_config('statement_timeout', $2::text, true)
