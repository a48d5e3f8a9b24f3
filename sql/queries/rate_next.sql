-- Seconds until the next start is allowed by the rate limits named $1 (each $2 starts per $3
-- seconds) that are full now: when the oldest of the last $2 starts leaves its window. NULL when
-- none is full. A worker held back by a rate claims again then, rather than at every poll.
SELECT extract(epoch FROM min(k.starts[cardinality(k.starts) - r.n + 1]
                              + make_interval(secs => r.period)) - statement_timestamp())::float8
       AS wait
FROM unnest($1::text[], $2::integer[], $3::integer[]) AS r(name, n, period)
JOIN {schema}.rate_windows AS w ON w.name = r.name
CROSS JOIN LATERAL (
    SELECT ARRAY(SELECT s FROM unnest(w.starts) AS s
                 WHERE s > statement_timestamp() - make_interval(secs => r.period)
                   AND s <= statement_timestamp()
                 ORDER BY s) AS starts
) AS k
WHERE cardinality(k.starts) >= r.n
