-- Claim up to $3 due jobs of the worker's queues ($1) whose (type, version) the worker serves (the
-- pairs $9, $10: each type with its version; $12, aligned, the most jobs of each, NULL for $3),
-- highest priority first, then oldest run_at, then id, across all of them. Each claimed job gets
-- an attempt row, and the task's max_retries ($6, aligned with the types $2) where the enqueuer
-- gave none. Worker id $4, lease $5 seconds, code version $7. The rows are whole jobs as the
-- claim left them. With $8 = 'off' the claim commits without waiting for its WAL flush (see the
-- README, "Fast claims"); with NULL it commits as the server is configured.
--
-- The claim of a worker that serves at most $3 (queue, type, version) in all, the common case;
-- job_claim_wide.sql claims for one that serves more (the Claimer chooses), with the same
-- parameters. Each (queue, type, version) served is read on its own, along jobs_claim_type_idx,
-- so that the pending jobs of the others (types no worker here serves, versions of another
-- release) are never read: the claim costs the same with none or with millions of them.
--
-- A paused queue, or one with a limit, is left out before any job is read: one probe of the
-- queues' primary key per queue served, whatever their backlog. The worker claims the jobs of
-- limited queues and tasks with job_claim_limited.sql; with $11 true, this claim takes them too
-- (pgworker.testing.drain, which runs one job at a time: no limit on running jobs can be
-- exceeded, and it does not wait for rate windows).
WITH {claim_served}, next AS MATERIALIZED (
    -- Each scan skips the jobs other claims hold and walks on past them: concurrent claims take
    -- different jobs.
    SELECT c.id
    FROM served AS s
    CROSS JOIN LATERAL (
        {claim_due}
        LIMIT s.most
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT $3
), {claimed}
{claimed_rows}
