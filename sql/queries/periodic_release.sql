-- A stopping worker ($1) gives up the lease $2 of its schedule set, so that another takes it.
DELETE FROM {schema}.leader WHERE name = $2 AND worker_id = $1
