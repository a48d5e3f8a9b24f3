SELECT {job_columns} FROM {schema}.jobs AS j WHERE j.id = $1
