-- Keep what was done since savepoint.sql, in the caller's transaction.
RELEASE SAVEPOINT pgworker_savepoint
