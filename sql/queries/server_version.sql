-- The server's version as it names itself, and its major (server_version_num is 150020 for
-- 15.20): migrate refuses a major older than the oldest one pgworker is tested on.
SELECT current_setting('server_version') AS version,
       current_setting('server_version_num')::int / 10000 AS major
