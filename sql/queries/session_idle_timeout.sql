-- End this session when it stays idle longer than $1 milliseconds (PostgreSQL 14 and later).
SELECT set_config('idle_session_timeout', $1, false)
