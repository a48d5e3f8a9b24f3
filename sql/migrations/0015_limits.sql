-- Cluster-wide limits (issue 23, items 2-4): at most N running jobs of a task or of a queue, at
-- most N running jobs per concurrency key of a task, at most N starts per period. Every claim of
-- a limited job runs under a transaction-scoped advisory lock of each limit it touches, then
-- counts what runs from the jobs table itself (sql/queries/job_claim_limited.sql): no counter
-- that can drift, and no lock held for longer than a claim.
--
-- A queue's limits, set by `pgworker queue limit` and read by every worker's claim: NULL is "no
-- limit", as a NULL paused_at is "not paused". The plain claim leaves out a queue that has any.
ALTER TABLE {schema}.queues
    ADD COLUMN max_running integer CHECK (max_running >= 1),
    ADD COLUMN rate_limit  integer CHECK (rate_limit BETWEEN 1 AND 10000),
    ADD COLUMN rate_period integer CHECK (rate_period BETWEEN 1 AND 86400),
    ADD CONSTRAINT queues_rate_whole CHECK ((rate_limit IS NULL) = (rate_period IS NULL));

-- The key a job shares its per-key limit with (a task's max_running_per_key): "customer-42".
-- NULL for every other job. A nullable column without a default rewrites nothing.
ALTER TABLE {schema}.jobs ADD COLUMN concurrency_key text
    CHECK (char_length(concurrency_key) BETWEEN 1 AND 200);

-- The keys with pending jobs of a (queue, type, version), each with its first job: only jobs
-- that have a key are in it, so that no other enqueue or claim pays for it.
CREATE INDEX jobs_claim_key_idx
    ON {schema}.jobs (queue, type, version, concurrency_key, priority DESC, run_at, id)
    WHERE status = 'pending' AND concurrency_key IS NOT NULL;

-- The starts of the last period of each rate limit ('queue:<name>' or 'type:<name>'), oldest
-- first, at most the limit's count: a start is allowed while fewer than the limit lie within the
-- period before it (a sliding window, so no burst of twice the rate across a boundary). Written
-- only under the limit's advisory lock.
CREATE TABLE {schema}.rate_windows (
    name       text PRIMARY KEY,
    starts     timestamptz[] NOT NULL DEFAULT '{}',
    updated_at timestamptz   NOT NULL DEFAULT now()
);

-- Where the round-robin between the concurrency keys of each (queue, type) stands: the last key
-- a claim served. The next claim walks the keys with pending jobs from the one after it, in key
-- order, wrapping around: each key gets its turn once per round, whatever its backlog, and a
-- claim reads as many keys as it takes jobs (plus those it must pass: at their limit, or none
-- due), not every key.
CREATE TABLE {schema}.key_cursors (
    queue      text        NOT NULL,
    type       text        NOT NULL,
    last_key   text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, type)
);
