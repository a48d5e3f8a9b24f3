-- The server process of this session. A pooler in between (PgBouncer, in either mode) gives its
-- clients a cancel key of its own, so the process id the connection was told at start-up
-- differs from this one: such a session cannot LISTEN for a worker.
SELECT pg_backend_pid()
