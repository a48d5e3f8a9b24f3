-- The claim of a worker that serves more (queue, type, version) than $3 in all; job_claim.sql
-- claims for one that serves fewer (the Claimer chooses). The parameters, the claim order and
-- the rows are job_claim.sql's. Each (queue, type, version) served is read on its own, along
-- jobs_claim_type_idx, so that the pending jobs of the others are never read; and only the $3
-- whose first due jobs come first are searched, so that a claim locks at most $3 jobs of $3 of
-- them, whatever their number.
WITH {claim_served}, picked AS (
    SELECT s.queue, s.type, s.version, s.most
    FROM served AS s
    CROSS JOIN LATERAL (
        {claim_due}
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
        {claim_due}
        LIMIT s.most
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT $3
), {claimed}
{claimed_rows}
