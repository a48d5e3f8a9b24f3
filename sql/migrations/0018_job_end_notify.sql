-- Awaiting a job (issue 24, item 2): `pgworker.wait(conn, job_id)` and GET /jobs/{id}?wait=.
--
-- A job's end is announced only for jobs someone awaits, so that plain jobs pay nothing: a waiter
-- sets `awaited` (pgworker/_waits.py), and a row trigger whose WHEN clause reads the old and new
-- rows sends NOTIFY on the channel `<schema>_ended` with the job id when an awaited job reaches a
-- final status. A trigger, not the completer: it sees every path to a final status (outcomes
-- written by workers or over HTTP, cancel, the rescue of a job out of retries, any later trigger
-- of pgworker's or by hand), and the WHEN clause is evaluated by the executor without calling the
-- function, so the finish of a job nobody awaits costs a comparison of two booleans.
--
-- `awaited` is not a field of models.Job: every claim returns a Job's columns. Adding a column
-- with a constant default rewrites nothing (PostgreSQL 11+: the default is kept in the catalog)
-- and takes an ACCESS EXCLUSIVE lock on `jobs` for an instant; no index is built.
ALTER TABLE {schema}.jobs ADD COLUMN awaited boolean NOT NULL DEFAULT false;

CREATE FUNCTION {schema}.notify_job_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({ended_channel}, NEW.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_ended_notify AFTER UPDATE OF status ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.awaited AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {schema}.notify_job_ended();
