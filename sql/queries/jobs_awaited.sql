-- The awaited jobs $1 (their ids): one row per id, `wanted` the id, `current` its status (null:
-- no such job, or pruned), and the job's columns when it ended (completed, failed or cancelled),
-- null otherwise: a job still running costs no payload or result sent back. One primary-key
-- probe per id: `= ANY(ARRAY[w.id])`, which no hash or merge join can use, so that no plan reads
-- the whole table instead (a hash join of a few hundred ids did, on a table of 20,000 jobs).
SELECT w.id AS wanted, s.status AS current, {job_columns}
FROM unnest($1::bigint[]) AS w(id)
LEFT JOIN LATERAL (SELECT * FROM {schema}.jobs AS x WHERE x.id = ANY(ARRAY[w.id])) AS s ON true
LEFT JOIN LATERAL (SELECT s.* WHERE s.status IN ('completed', 'failed', 'cancelled')) AS j ON true
