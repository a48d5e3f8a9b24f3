SELECT pg_try_advisory_lock(hashtext('pgworker.maintenance'), hashtext($1)) AS leader
