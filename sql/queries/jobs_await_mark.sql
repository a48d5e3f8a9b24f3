-- Mark jobs as awaited ($1: their ids), so that their end is announced on the ended channel
-- (migration 0018's trigger). Sent after LISTEN and before the jobs are read (jobs_awaited.sql),
-- each in its own statement: a job that ends after this commits is announced, one that ended
-- before is read as ended. Only unfinished jobs not already marked are written.
UPDATE {schema}.jobs SET awaited = true
WHERE id = ANY($1::bigint[]) AND NOT awaited AND status IN ('pending', 'running')
