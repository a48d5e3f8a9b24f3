-- Effects that happen once, and operating failed jobs: durable steps and milestones, the events
-- an operator caused (replays), the full (redacted) error of each attempt, payload versions for
-- rolling deploys, the start of a job's retry budget, and what retention needs to find old jobs.

-- One row per step a job completed: its result is returned, without running the step again, to
-- the later attempts of the same job. No foreign key, as for attempts: pruning deletes them with
-- their job.
CREATE TABLE {schema}.job_steps (
    job_id      bigint      NOT NULL,
    name        text        NOT NULL CHECK (name <> ''),
    result      jsonb,
    attempt     integer     NOT NULL CHECK (attempt >= 1),
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name)
);

-- Every milestone a job reported (`jobs.progress` holds the last one).
CREATE TABLE {schema}.job_milestones (
    job_id    bigint      NOT NULL,
    seq       bigint      GENERATED ALWAYS AS IDENTITY,
    attempt   integer     NOT NULL,
    milestone text        NOT NULL,
    detail    jsonb,
    at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, seq)
);

-- What people did to a job (a replay: who, when, why).
CREATE TABLE {schema}.job_events (
    id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint      NOT NULL,
    kind   text        NOT NULL,
    actor  text,
    reason text,
    at     timestamptz NOT NULL DEFAULT now(),
    detail jsonb
);
CREATE INDEX job_events_job_idx ON {schema}.job_events (job_id);

-- The attempt's whole error (traceback included), redacted and cut to 8 KB; error_message keeps
-- its first line.
ALTER TABLE {schema}.job_attempts ADD COLUMN error_detail text;

-- `snoozed`: the handler asked to run later (pgworker.Snooze), without spending a retry.
ALTER TABLE {schema}.job_attempts DROP CONSTRAINT job_attempts_outcome_check;
ALTER TABLE {schema}.job_attempts ADD CONSTRAINT job_attempts_outcome_check
    CHECK (outcome IN ('running', 'completed', 'retried', 'failed', 'timed_out', 'interrupted',
                       'cancelled', 'lost', 'snoozed'));

-- The payload's version (a task's `version=`): a worker claims only the versions it serves.
ALTER TABLE {schema}.jobs ADD COLUMN version integer NOT NULL DEFAULT 1 CHECK (version >= 1);

-- When the job's retry budget in time (RetryPolicy.max_elapsed) started: its first claim, and
-- again its first claim after a replay (a replay sets it back to NULL).
ALTER TABLE {schema}.jobs ADD COLUMN budget_started_at timestamptz;

-- Retention deletes finished jobs oldest first, a batch at a time.
CREATE INDEX jobs_finished_idx ON {schema}.jobs (finished_at) WHERE finished_at IS NOT NULL;
