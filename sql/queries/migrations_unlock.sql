SELECT pg_advisory_unlock(hashtext('pgworker.migrate'), hashtext($1))
