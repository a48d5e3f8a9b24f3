DELETE FROM {schema}.workers WHERE worker_id = $1
