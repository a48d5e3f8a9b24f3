-- A page of the job lists (the dashboard's, `pgworker jobs list`): the jobs matching the filter
-- ($1-$12, _job_filter.sql), newest first, paged by key on id: below id $13 (NULL: from the
-- newest), at most $14. Read backwards along the primary key, never counted; the payload and
-- result stay out (one may hold 64 MB). Each row has its error's first line, its last attempt's
-- traceback and run time, and the event it waits for (_job_list_columns.sql: a primary-key
-- probe of job_attempts and one of job_event_waits per row shown).
SELECT {job_list_columns}
FROM {schema}.jobs AS j
{job_list_joins}
WHERE {job_filter}
  AND ($13::bigint IS NULL OR j.id < $13::bigint)
ORDER BY j.id DESC
LIMIT $14
