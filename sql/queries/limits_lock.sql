-- The first statement of a limited claim: take the transaction-scoped advisory lock of
-- every limit the worker's claim may touch, in one order (no two claims wait on each other in a
-- circle), so that the claims that follow in the same transaction count what runs after every
-- earlier claim of those limits committed. The limits: the worker's queues ($1) that have a
-- max_running or a rate, and the task types ($2) that declare one. Returns those queues with
-- their limits; a paused one is left out (nothing is claimed from it).
WITH wanted AS (
    SELECT 'queue:' || c.name AS lock_name, c.name, c.max_running, c.rate_limit, c.rate_period
    FROM {schema}.queues AS c
    WHERE c.name = ANY($1::text[]) AND c.paused_at IS NULL
      AND (c.max_running IS NOT NULL OR c.rate_limit IS NOT NULL)
    UNION ALL
    SELECT 'type:' || t.name, NULL, NULL, NULL, NULL
    FROM unnest($2::text[]) AS t(name)
), ordered AS (
    SELECT w.*, hashtextextended({schema_literal} || ':' || w.lock_name, 0) AS lock_key
    FROM wanted AS w
    ORDER BY lock_key
    OFFSET 0
), locked AS MATERIALIZED (
    SELECT o.*, pg_advisory_xact_lock(o.lock_key) AS taken
    FROM ordered AS o
)
SELECT name, max_running, rate_limit, rate_period
FROM locked
WHERE name IS NOT NULL
ORDER BY name
