-- The server process of this session, and its database. A pooler in between (PgBouncer, in
-- either mode) gives its clients a cancel key of its own, so the process id the connection was
-- told at start-up differs from this one: such a session cannot LISTEN for a worker; nor can
-- one in another database, since NOTIFY is delivered within one database only.
SELECT pg_backend_pid() AS pid, current_database() AS database
