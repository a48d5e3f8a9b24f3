-- The privileges a worker needs on schema $1 and does not have, one row each (none: all held).
SELECT n.object, n.privilege
FROM (VALUES ('SCHEMA', '', 'USAGE'),
             ('TABLE', 'jobs', 'SELECT'), ('TABLE', 'jobs', 'INSERT'),
             ('TABLE', 'jobs', 'UPDATE'),
             ('TABLE', 'job_attempts', 'SELECT'), ('TABLE', 'job_attempts', 'INSERT'),
             ('TABLE', 'job_attempts', 'UPDATE'),
             ('TABLE', 'workers', 'SELECT'), ('TABLE', 'workers', 'INSERT'),
             ('TABLE', 'workers', 'UPDATE'), ('TABLE', 'workers', 'DELETE'),
             ('TABLE', 'leader', 'SELECT'), ('TABLE', 'leader', 'INSERT'),
             ('TABLE', 'leader', 'UPDATE'), ('TABLE', 'leader', 'DELETE'),
             ('TABLE', 'periodic', 'SELECT'), ('TABLE', 'periodic', 'INSERT'),
             ('TABLE', 'periodic', 'UPDATE'),
             ('TABLE', 'queues', 'SELECT'),
             ('TABLE', 'rate_windows', 'SELECT'), ('TABLE', 'rate_windows', 'INSERT'),
             ('TABLE', 'rate_windows', 'UPDATE'), ('TABLE', 'rate_windows', 'DELETE'),
             ('TABLE', 'key_cursors', 'SELECT'), ('TABLE', 'key_cursors', 'INSERT'),
             ('TABLE', 'key_cursors', 'UPDATE'))
     AS p(kind, tbl, privilege)
CROSS JOIN LATERAL (
    SELECT CASE WHEN p.kind = 'SCHEMA' THEN format('SCHEMA %I', $1::text)
                ELSE format('%I.%I', $1::text, p.tbl) END AS object,
           p.privilege
) AS n
WHERE CASE WHEN p.kind = 'SCHEMA' THEN NOT has_schema_privilege($1::text, p.privilege)
           ELSE NOT has_table_privilege(format('%I.%I', $1::text, p.tbl), p.privilege) END
