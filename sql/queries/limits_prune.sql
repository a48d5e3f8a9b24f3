-- Forget the rate windows not written for a day, at most $1 of them: their starts are all older
-- than the longest period (a day), so none counts any more.
WITH windows AS (
    DELETE FROM {schema}.rate_windows AS w
    USING (SELECT name FROM {schema}.rate_windows
           WHERE updated_at < now() - interval '1 day'
           LIMIT $1) AS old
    WHERE w.name = old.name
    RETURNING 1
)
SELECT count(*) AS forgotten FROM windows
