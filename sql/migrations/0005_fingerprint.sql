-- The idempotency fingerprint in one place: every statement that writes or compares one calls
-- this function (SQL, so the planner inlines it), and so will an enqueue written in SQL.
CREATE FUNCTION {schema}.fingerprint(type text, payload jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT md5($1 || chr(31) || $2::text) $$;
