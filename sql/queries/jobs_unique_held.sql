-- Of the failed or cancelled jobs $1, those whose unique key (migration 17) another live job of
-- their bucket holds now, with the holder: a replay would skip them (see jobs_replay.sql). What
-- `replay(dry_run=True)` reports.
SELECT j.id, h.id AS held_by
FROM {schema}.jobs AS j
JOIN LATERAL (
    SELECT h.id FROM {schema}.jobs AS h
    WHERE h.queue = j.queue AND h.type = j.type AND h.unique_key = j.unique_key
      AND h.unique_bucket = j.unique_bucket AND h.id <> j.id
      AND h.unique_key IS NOT NULL AND {schema}.unique_state_in(h.unique_states, h.status)
) AS h ON true
WHERE j.id = ANY($1::bigint[]) AND j.status IN ('failed', 'cancelled')
  AND j.unique_key IS NOT NULL AND NOT {schema}.unique_state_in(j.unique_states, j.status)
