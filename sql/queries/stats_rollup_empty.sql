-- Mark as rolled up, empty, the minutes of the last $2 seconds never rolled up that ended $3
-- seconds or more before the oldest job was created (or before now, without jobs): nothing
-- happened in them, since a job's attempts are kept and pruned with it, and a new install would
-- otherwise roll up a day of empty minutes one statement each. $3 is the rollup's recheck
-- delay: the minutes closer than that are rolled up as usual. Fenced by the leader's lease ($1)
-- as stats_rollup.sql is. Returns how many minutes were marked.
WITH fence AS (
    SELECT $1::text IS NULL
           OR EXISTS (SELECT FROM {schema}.leader
                      WHERE name = 'maintenance' AND worker_id = $1::text
                        AND expires_at > now()) AS held
), marked AS (
    INSERT INTO {schema}.stats_rollup AS r (minute, rolled_at, running)
    SELECT m.minute, now(), 0
    FROM generate_series(
             date_bin(interval '1 minute', now() - make_interval(secs => $2::float8), 'epoch'),
             least(coalesce((SELECT j.created_at FROM {schema}.jobs AS j ORDER BY j.id LIMIT 1),
                            now()), now())
                 - make_interval(secs => 60 + $3::float8),
             interval '1 minute') AS m(minute)
    WHERE (SELECT held FROM fence)
    ON CONFLICT (minute) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM marked
