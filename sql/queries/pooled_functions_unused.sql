-- The pooled functions of the schema (`_pooled_<statement>_<digest>`, Queries.pooled_functions)
-- that no one may call any more: neither this release's own ($1) nor any a registered worker
-- says it calls (workers.functions), and none at all while a registered worker does not say (a
-- release before migration 27: NULL), as it may call any. HTTP workers call none. A worker's row
-- stays until it stops, or for a day after it was last seen (workers_prune.sql). Only the
-- functions of roles this one is a member of: the others are not its to drop. Each comes as the
-- quoted signature DROP FUNCTION takes.
SELECT p.proname AS name,
       format('%I.%I(%s)', n.nspname, p.proname, pg_get_function_identity_arguments(p.oid))
           AS signature
FROM pg_proc AS p
JOIN pg_namespace AS n ON n.oid = p.pronamespace AND n.nspname = {schema_literal}
WHERE p.proname LIKE '\_pooled\_%'
  AND p.proname <> ALL ($1::text[])
  AND pg_has_role(p.proowner, 'USAGE')
  AND NOT EXISTS (SELECT FROM {schema}.workers AS w WHERE NOT w.http AND w.functions IS NULL)
  AND NOT EXISTS (SELECT FROM {schema}.workers AS w WHERE p.proname = ANY (w.functions))
ORDER BY p.proname
