-- pgworker.testing: empty every table of the schema but the applied migrations, and restart
-- their identities (job ids start at 1 again). The tables are listed from the catalog, so that a
-- table added by a later migration is emptied too.
DO $reset$
DECLARE
    tables text;
BEGIN
    SELECT string_agg(c.oid::regclass::text, ', ') INTO tables
    FROM pg_class AS c
    WHERE c.relnamespace = '{schema}'::regnamespace AND c.relkind IN ('r', 'p')
      AND NOT c.relispartition AND c.relname <> 'migrations';
    IF tables IS NOT NULL THEN
        EXECUTE 'TRUNCATE ' || tables || ' RESTART IDENTITY';
    END IF;
END
$reset$
