-- A savepoint in a transaction the caller began with a raw BEGIN, where asyncpg refuses to nest
-- its own transaction (connection.transaction): the statements after it are undone together.
-- One name for all: PostgreSQL releases or rolls back to the latest savepoint of a name.
SAVEPOINT pgworker_savepoint
