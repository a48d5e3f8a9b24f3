-- The awaited jobs $1 (their ids): one row per id, `wanted` the id, `current` its status (null:
-- no such job, or pruned), and the job's columns when it ended (completed, failed or cancelled),
-- null otherwise: a job still running costs no payload or result sent back.
SELECT w.id AS wanted, s.status AS current, {job_columns}
FROM unnest($1::bigint[]) AS w(id)
LEFT JOIN {schema}.jobs AS s ON s.id = w.id
LEFT JOIN {schema}.jobs AS j
    ON j.id = s.id AND s.status IN ('completed', 'failed', 'cancelled')
