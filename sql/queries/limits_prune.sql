-- Forget what the limits no longer need, at most $1 rows of each table per call: the keys not
-- served for a day (a key without a row counts as served least recently, which such a key is
-- anyway), and the rate windows not written for a day (their starts are all older than the
-- longest period, a day: none counts any more).
WITH turns AS (
    DELETE FROM {schema}.key_turns AS k
    USING (SELECT type, key FROM {schema}.key_turns
           WHERE served_at < now() - interval '1 day'
           LIMIT $1) AS old
    WHERE k.type = old.type AND k.key = old.key
    RETURNING 1
), windows AS (
    DELETE FROM {schema}.rate_windows AS w
    USING (SELECT name FROM {schema}.rate_windows
           WHERE updated_at < now() - interval '1 day'
           LIMIT $1) AS old
    WHERE w.name = old.name
    RETURNING 1
)
SELECT (SELECT count(*) FROM turns) + (SELECT count(*) FROM windows) AS forgotten
