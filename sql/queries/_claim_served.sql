-- The start of the plain claims (job_claim.sql, job_claim_wide.sql), their parameters named:
-- `claim`, what the shared end (_claimed.sql) writes, and `served`, each (queue, type, version)
-- served whose queue is open to this claim, with the most jobs this claim takes of it.
claim AS NOT MATERIALIZED (
    SELECT $4::text AS worker_id, $5::float8 AS lease, $7::text AS code_version,
           $8::text AS synchronous_commit, now() AS at,
           $2::text[] AS types, $6::integer[] AS max_retries
), served AS (
    SELECT q.name AS queue, s.type, s.version, least(s.most, $3) AS most
    FROM unnest($1::text[]) AS q(name)
    CROSS JOIN unnest($9::text[], $10::integer[], $12::integer[]) AS s(type, version, most)
    -- A subquery per queue rather than an anti-join: a probe of the primary key, whatever the
    -- planner believes of the table's size (empty when the plan was made, or not). A paused
    -- queue is left out, and one with a limit unless $11 (job_claim_limited.sql claims those).
    -- A queue without a row has no controls: the subquery is NULL.
    WHERE (SELECT c.paused_at IS NOT NULL
                  OR (c.max_running IS NOT NULL OR c.rate_limit IS NOT NULL) AND NOT $11::boolean
           FROM {schema}.queues AS c
           WHERE c.name = q.name) IS NOT TRUE
)
