-- pgworker schema, version 1: jobs, their attempts, and the workers serving them.
-- {schema} is replaced by the quoted schema name (default "pgworker").

CREATE TABLE {schema}.jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    type             text        NOT NULL CHECK (type <> ''),
    queue            text        NOT NULL DEFAULT 'default' CHECK (queue <> ''),
    payload          jsonb       NOT NULL DEFAULT '{}',
    priority         integer     NOT NULL DEFAULT 0,
    status           text        NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    retry_count      integer     NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    -- NULL until a worker first claims the job and writes its task's default.
    max_retries      integer     CHECK (max_retries >= 0),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    idempotency_key  text,
    fingerprint      text,
    correlation_id   text        NOT NULL DEFAULT gen_random_uuid()::text,
    run_at           timestamptz NOT NULL DEFAULT now(),
    claimed_at       timestamptz,
    worker_id        text,
    lease_expires_at timestamptz,
    heartbeat_at     timestamptz,
    error            text,
    progress         jsonb,
    result           jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz
) WITH (fillfactor = 80);

-- Idempotency keys are unique; jobs without one stay out of the index.
CREATE UNIQUE INDEX jobs_idempotency_key_idx ON {schema}.jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- The claim: pending jobs of a queue, highest priority first, then oldest run_at, then id.
CREATE INDEX jobs_claim_idx ON {schema}.jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending';
-- Rescue of expired leases and the status command's view of running jobs.
CREATE INDEX jobs_running_lease_idx ON {schema}.jobs (lease_expires_at)
    WHERE status = 'running';

CREATE TABLE {schema}.job_attempts (
    -- Numbered in insertion order; (job_id, attempt) is the key, and id stays unindexed.
    id             bigint GENERATED ALWAYS AS IDENTITY,
    -- No foreign key: only pgworker's own statements write attempts, always for a job they hold,
    -- and the check would cost a lookup per attempt. Pruning deletes a job's attempts with it.
    job_id         bigint      NOT NULL,
    attempt        integer     NOT NULL CHECK (attempt >= 1),
    type           text        NOT NULL,
    queue          text        NOT NULL,
    worker_id      text        NOT NULL,
    correlation_id text        NOT NULL,
    outcome        text        NOT NULL DEFAULT 'running'
                   CHECK (outcome IN ('running', 'completed', 'retried', 'failed', 'timed_out',
                                      'interrupted', 'cancelled', 'lost')),
    started_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    error_type     text,
    error_message  text,
    code_version   text,
    PRIMARY KEY (job_id, attempt)
) WITH (fillfactor = 80);

-- Dashboards: attempts over a time range, overall (BRIN: rows arrive in time order, so a tiny
-- index serves ranges) or for one type. Outcome and finished_at stay unindexed so that closing
-- an attempt is a HOT update; filter them within a time range.
CREATE INDEX job_attempts_started_idx ON {schema}.job_attempts USING brin (started_at);
CREATE INDEX job_attempts_type_started_idx ON {schema}.job_attempts (type, started_at);

-- Live workers, so that operators can see which job types nobody serves.
CREATE TABLE {schema}.workers (
    worker_id    text PRIMARY KEY,
    hostname     text        NOT NULL,
    pid          integer     NOT NULL,
    queues       text[]      NOT NULL,
    types        text[]      NOT NULL,
    concurrency  integer     NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now()
);

-- One NOTIFY per statement and queue (PostgreSQL folds duplicates within a transaction), delivered
-- only if the enqueuing transaction commits. The payload is the queue name.
CREATE FUNCTION {schema}.notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({jobs_channel}, q.queue)
    FROM (SELECT DISTINCT queue FROM new_jobs WHERE status = 'pending') AS q;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify AFTER INSERT ON {schema}.jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_jobs();
