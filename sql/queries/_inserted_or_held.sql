-- The job CTE `ins` inserted (created and matches true) or, when its idempotency key $6 was
-- taken, the job that holds it (created false; matches: whether it was created with the same
-- type $1 and payload $3, as JSON values: same_work in migration 10).
SELECT true AS created, true AS matches, ins.* FROM ins
UNION ALL
SELECT false, {schema}.same_work(j.type, j.payload, $1, $3::jsonb),
       {job_columns}
FROM {schema}.jobs AS j
WHERE $6::text IS NOT NULL AND j.idempotency_key = $6::text AND NOT EXISTS (SELECT FROM ins)
