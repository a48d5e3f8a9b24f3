-- Bound every statement of one request of `pgworker serve`: $1 milliseconds waiting on a lock, $2
-- running, for the rest of its transaction only (set_config's `true`: SET LOCAL). Set inside the
-- transaction rather than as a startup parameter or a session SET: a transaction pooler
-- (PgBouncer in transaction mode) refuses the one and loses the other. $3, unless NULL (a server
-- without the setting, request_client_check.sql): every $3 milliseconds the backend checks that
-- serve still holds the connection, and rolls the transaction back once it does not (serve
-- closes it when it gives the request up), even in a COMMIT's deferred triggers, which
-- statement_timeout no longer bounds.
SELECT set_config('lock_timeout', $1::text, true), set_config('statement_timeout', $2::text, true),
       CASE WHEN $3::text IS NOT NULL
            THEN set_config('client_connection_check_interval', $3::text, true) END
