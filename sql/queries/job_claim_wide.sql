-- Claim up to $3 due jobs of the worker's queues ($1) whose (type, version) the worker serves (the
-- pairs $9, $10: each type with its version; $12, aligned, the most jobs of each, NULL for $3),
-- highest priority first, then oldest run_at, then id, across all of them. Each claimed job gets
-- an attempt row, and the task's max_retries ($6, aligned with the types $2) where the enqueuer
-- gave none. The rows are whole jobs as the claim left them. With $8 = 'off' the claim commits
-- without waiting for its WAL flush (see the README, "Fast claims"); with NULL it commits as the
-- server is configured.
--
-- The claim of a worker that serves more (queue, type, version) than $3 in all; job_claim.sql
-- claims for one that serves fewer (Queries.job_claim chooses), with the same parameters. Each
-- (queue, type, version) served is read on its own, along jobs_claim_type_idx, so that the
-- pending jobs of the others (types no worker here serves, versions of another release) are never
-- read: the claim costs the same with none or with millions of them.
--
-- A paused queue (migration 0013, `queues.paused_at`), or one with a limit (0015), is left out
-- before any job is read: one probe of the queues' primary key per queue served, whatever their
-- backlog. The worker claims the jobs of limited queues and tasks with job_claim_limited.sql;
-- with $11 true, this claim takes them too (pgworker.testing.drain, which runs one job at a
-- time: no limit on running jobs can be exceeded, and it does not wait for rate windows).
WITH served AS (
    SELECT q.name AS queue, s.type, s.version, least(s.most, $3) AS most
    FROM unnest($1::text[]) AS q(name)
    CROSS JOIN unnest($9::text[], $10::integer[], $12::integer[]) AS s(type, version, most)
    -- A subquery per queue rather than an anti-join: a probe of the primary key, whatever the
    -- planner believes of the table's size (empty when the plan was made, or not).
    -- A queue with a limit (migration 0015) is claimed from by job_claim_limited.sql only. A
    -- queue without a row has no controls: the subquery is NULL.
    WHERE (SELECT c.paused_at IS NOT NULL
                  OR (c.max_running IS NOT NULL OR c.rate_limit IS NOT NULL) AND NOT $11::boolean
           FROM {schema}.queues AS c
           WHERE c.name = q.name) IS NOT TRUE
), picked AS (
    -- The jobs claimed are among the first $3 of the (queue, type, version) whose first due jobs
    -- come first: only those are searched, so that a claim locks at most $3 jobs of $3 of them,
    -- whatever their number.
    SELECT s.queue, s.type, s.version, s.most
    FROM served AS s
    CROSS JOIN LATERAL (
        SELECT j.priority, j.run_at, j.id
        FROM {schema}.jobs AS j
        WHERE j.status = 'pending' AND j.queue = s.queue AND j.type = s.type
          AND j.version = s.version AND j.run_at <= now()
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT 1
    ) AS first
    ORDER BY first.priority DESC, first.run_at, first.id
    LIMIT $3
), next AS MATERIALIZED (
    -- Each scan skips the jobs other claims hold and walks on past them: concurrent claims take
    -- different jobs.
    SELECT c.id
    FROM picked AS s
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM {schema}.jobs AS j
        WHERE j.status = 'pending' AND j.queue = s.queue AND j.type = s.type
          AND j.version = s.version AND j.run_at <= now()
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT s.most
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT $3
), {claimed}
