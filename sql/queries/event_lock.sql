-- The first statement of a wait's transaction (event_wait.sql): the transaction-scoped advisory
-- lock of event name $1, which emit (migration 0020) takes too, so that the wait's statement,
-- run after it with a snapshot of its own, reads every event emitted before it.
SELECT pg_advisory_xact_lock(hashtextextended({schema_literal} || ':event:' || $1::text, 0))
