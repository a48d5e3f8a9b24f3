-- How many jobs match the filter ($1-$12, _job_filter.sql) up to the id $13 (NULL: the highest
-- id now), and that bound: what a bulk action confirms and then touches (jobs enqueued later
-- stay out). One count of the matching jobs, for an action, never per page of a list.
WITH bound AS (
    SELECT coalesce($13::bigint, (SELECT max(m.id) FROM {schema}.jobs AS m), 0) AS max_id
)
SELECT b.max_id,
       (SELECT count(*) FROM {schema}.jobs AS j WHERE {job_filter} AND j.id <= b.max_id)
           AS matched
FROM bound AS b
