-- A stopping leader ($1) gives the leadership up, so that another worker takes it at once.
DELETE FROM {schema}.leader WHERE name = 'maintenance' AND worker_id = $1
