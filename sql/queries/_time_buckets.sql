-- The histogram buckets of the times (seconds) `wait` and `run` of row `r`, as stats_minutes
-- keeps them: bucket 0 under 0.1 ms, else 1 + floor(4 * log2(time / 0.1 ms)), at most 132.
CASE WHEN r.wait < 0.0001 THEN 0
     ELSE least(1 + floor(4 * ln(r.wait / 0.0001) / ln(2)), 132) END::smallint AS wb,
CASE WHEN r.run < 0.0001 THEN 0
     ELSE least(1 + floor(4 * ln(r.run / 0.0001) / ln(2)), 132) END::smallint AS rb
