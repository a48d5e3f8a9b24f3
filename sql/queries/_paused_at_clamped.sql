-- The paused_at of row `s`, kept within what Python's datetime holds (years 1 to 9999): a row
-- written by hand may hold 'infinity', '-infinity' or a year BC, which asyncpg cannot give as an
-- aware datetime; the statement would fail rather than say how the queue stands.
CASE WHEN s.paused_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'::timestamptz
     WHEN s.paused_at > '9999-12-31 23:59:59.999999+00'
     THEN '9999-12-31 23:59:59.999999+00'::timestamptz ELSE s.paused_at END
