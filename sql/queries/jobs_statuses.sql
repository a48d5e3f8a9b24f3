-- The status of each of the jobs $1 that exists (what a dry-run replay checks).
SELECT j.id, j.status FROM {schema}.jobs AS j WHERE j.id = ANY($1::bigint[]) ORDER BY j.id
