-- Runner $1 stops: the running actions it holds are left to the others at once (their lease ends
-- now) rather than after their lease.
UPDATE {schema}.bulk_actions
SET lease_until = now()
WHERE runner = $1::text AND state = 'running'
