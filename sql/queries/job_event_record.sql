-- What an operator did to job $1 that no other statement records (a job enqueued from the
-- console): an entry of its job_events of kind $2, by $3, with the detail $4 (JSON, or NULL),
-- which the job's page and the operator log show.
INSERT INTO {schema}.job_events (job_id, kind, actor, detail)
VALUES ($1, $2, $3, $4::jsonb)
