-- Undo what was done since savepoint.sql (the caller's transaction goes on, usable again).
ROLLBACK TO SAVEPOINT pgworker_savepoint; RELEASE SAVEPOINT pgworker_savepoint
