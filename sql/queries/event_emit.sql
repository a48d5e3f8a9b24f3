-- Emit event $1 with data $2 (JSON text, NULL for none) through the SQL function of migration
-- 0020, in the caller's transaction; returns how many waiting jobs it woke.
SELECT {schema}.emit($1::text, $2::jsonb) AS woken
