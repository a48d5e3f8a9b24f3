-- The ids of the failed jobs of type $1 (of queue $2 when given, failed at or after $3 when
-- given), oldest failure first: what `replay --type` replays.
SELECT j.id
FROM {schema}.jobs AS j
WHERE j.finished_at IS NOT NULL AND j.status = 'failed' AND j.type = $1::text
  AND ($2::text IS NULL OR j.queue = $2::text)
  AND ($3::timestamptz IS NULL OR j.finished_at >= $3::timestamptz)
ORDER BY j.finished_at, j.id
