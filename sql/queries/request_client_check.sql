-- Whether the server takes client_connection_check_interval (request_bounds.sql's $3), set for
-- this transaction only: PostgreSQL 13 and older know no such setting (SQLSTATE 42704), and a
-- server on a system that cannot tell a closed connection (Windows) refuses any value but 0
-- (22023). Asked once, when serve starts.
SELECT set_config('client_connection_check_interval', $1::text, true)
