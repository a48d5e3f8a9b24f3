-- The job lists' filter (pgworker/_filters.py), parameters $1 to $12, each NULL for any: status
-- $1, queue $2, type starting with $3, error matching the ILIKE pattern $4, created in
-- [$5, $6), finished in [$7, $8), correlation id $9, id one of $10 (the filter's id, or a
-- selection of ids), payload containing the JSON $11, error group (migration 30) $12.
($1::text IS NULL OR j.status = $1::text)
  AND ($2::text IS NULL OR j.queue = $2::text)
  AND ($3::text IS NULL OR starts_with(j.type, $3::text))
  AND ($4::text IS NULL OR j.error ILIKE $4::text)
  AND ($5::timestamptz IS NULL OR j.created_at >= $5::timestamptz)
  AND ($6::timestamptz IS NULL OR j.created_at < $6::timestamptz)
  AND ($7::timestamptz IS NULL OR j.finished_at >= $7::timestamptz)
  AND ($8::timestamptz IS NULL OR j.finished_at < $8::timestamptz)
  AND ($9::text IS NULL OR j.correlation_id = $9::text)
  AND ($10::bigint[] IS NULL OR j.id = ANY($10::bigint[]))
  AND ($11::jsonb IS NULL OR j.payload @> $11::jsonb)
  AND ($12::text IS NULL OR j.error_group = $12::text)
