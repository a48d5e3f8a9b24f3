-- A batch of bulk action $1 done: its cursor moves to $2, $3 more jobs handled and $4 more left as
-- they were (their status no longer fits the action); finished when $5.
UPDATE {schema}.bulk_actions
SET cursor = $2::bigint,
    done = done + $3::bigint,
    skipped = skipped + $4::bigint,
    state = CASE WHEN $5::boolean THEN 'done' ELSE state END,
    finished_at = CASE WHEN $5::boolean THEN now() ELSE finished_at END,
    updated_at = now()
WHERE id = $1::bigint
