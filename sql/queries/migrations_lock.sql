SELECT pg_advisory_lock(hashtext('pgworker.migrate'), hashtext($1))
