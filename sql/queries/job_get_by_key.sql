SELECT false AS created,
       j.fingerprint IS NOT DISTINCT FROM md5($2 || chr(31) || $3::jsonb::text) AS matches,
       {job_columns}
FROM {schema}.jobs AS j
WHERE j.idempotency_key = $1
