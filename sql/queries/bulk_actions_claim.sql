-- The running bulk actions runner $1 (of kind $2: console, serve, worker or cli) holds once this
-- statement commits, oldest first, each with its lease renewed to now + $3 seconds: those it held
-- already, those never taken, and those whose owner's lease has lapsed (adopted: `previous` names
-- the owner it had); only action $4 when $4 is not null. An action another session has locked (a
-- batch of its owner's under way) is skipped, never waited for. `runner_since` moves only when
-- the action changes hands.
WITH free AS (
    SELECT id, runner
    FROM {schema}.bulk_actions
    WHERE state = 'running'
      AND ($4::bigint IS NULL OR id = $4::bigint)
      AND (runner IS NULL OR runner = $1::text OR lease_until < now())
    ORDER BY id
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.bulk_actions AS a
SET runner = $1::text,
    runner_kind = $2::text,
    runner_since = CASE WHEN a.runner = $1::text THEN a.runner_since ELSE now() END,
    lease_until = now() + make_interval(secs => $3::float8)
FROM free
WHERE a.id = free.id
RETURNING a.id, free.runner AS previous
