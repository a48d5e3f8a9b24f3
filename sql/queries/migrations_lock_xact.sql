-- The migrations' lock held until the transaction ends (pooler mode): a transaction pooler keeps
-- no session lock. The same key as migrations_lock.sql, so that both modes exclude each other.
SELECT pg_advisory_xact_lock(hashtext('pgworker.migrate'), hashtext($1))
