-- pgworker.testing: drop the session's scratch database, whatever connections a test left open.
DROP DATABASE IF EXISTS {database} WITH (FORCE)
