-- The parents $1 of a job, whole (what ctx.parents holds): one primary-key probe each. A parent
-- pruned since is missing from the rows.
SELECT {job_columns} FROM {schema}.jobs AS j WHERE j.id = ANY($1::bigint[]) ORDER BY j.id
