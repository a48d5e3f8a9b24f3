-- Forget workers not seen for $1 seconds (crashed without unregistering).
DELETE FROM {schema}.workers WHERE last_seen_at < now() - make_interval(secs => $1::float8)
