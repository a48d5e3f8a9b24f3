-- Of the pooled functions named $1, those the schema does not hold, after waiting for any other
-- session making them or migrating: the migrations' lock (migrations_lock_xact.sql), held by
-- the transaction, as a transaction pooler keeps no session's.
SELECT f.name
FROM unnest($1::text[]) AS f(name)
WHERE (SELECT pg_advisory_xact_lock(hashtext('pgworker.migrate'), hashtext({schema_literal})))
      IS NOT NULL
  AND NOT EXISTS (SELECT FROM pg_proc AS p
                  JOIN pg_namespace AS n ON n.oid = p.pronamespace
                  WHERE n.nspname = {schema_literal} AND p.proname = f.name)
