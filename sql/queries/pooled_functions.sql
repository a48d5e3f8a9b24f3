-- Of the pooled functions named $1, those the role cannot call as they are: `made` false for
-- one the schema does not hold (to be made), true for one it holds that the role may not
-- execute (EXECUTE revoked from PUBLIC) or that another role made: its statement stays plain.
-- Sent after the migrations' lock is taken (migrations_lock_xact.sql), as a statement of its
-- own: its snapshot, taken after the wait, sees what the session that held the lock made.
SELECT f.name, p.oid IS NOT NULL AS made
FROM unnest($1::text[]) AS f(name)
LEFT JOIN (pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
                                              AND n.nspname = {schema_literal})
       ON p.proname = f.name
WHERE p.oid IS NULL OR NOT has_function_privilege(p.oid, 'EXECUTE')
   -- Made by a role other than the schema's owner and this one: not run, whatever it holds
   -- (a role allowed to create in the schema could have made it first, to be run by others).
   OR p.proowner <> n.nspowner
      AND p.proowner <> (SELECT r.oid FROM pg_roles AS r WHERE r.rolname = current_user)
