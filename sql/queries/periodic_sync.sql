-- The leader of a schedule set ($1, holding the lease $2) makes sure each of its schedules has its
-- row and reads where each one stands: $3-$6, aligned, name, task, definition and the slot to
-- start from when the row is new or its definition changed (the first slot after now: a new or
-- changed schedule does not catch up). Fenced by the lease: no row comes back unless $1 holds it.
-- A stored next slot later than the first slot after now, or before the year 1, was not written
-- by a leader (each writes the first slot after its now): a row set by hand ('infinity', a year
-- BC or 9999) starts from now as a new one, rather than stop the schedule or the whole set.
WITH lease AS (
    SELECT FROM {schema}.leader WHERE name = $2 AND worker_id = $1 AND expires_at > now()
)
INSERT INTO {schema}.periodic AS p (name, type, schedule, next_slot)
SELECT s.name, s.type, s.schedule, s.next_slot
FROM unnest($3::text[], $4::text[], $5::text[], $6::timestamptz[])
     AS s(name, type, schedule, next_slot)
WHERE EXISTS (SELECT FROM lease)
ORDER BY s.name
ON CONFLICT (name) DO UPDATE
SET type = excluded.type,
    schedule = excluded.schedule,
    next_slot = CASE WHEN p.schedule = excluded.schedule
                          AND p.next_slot BETWEEN '0001-01-01 00:00:00+00' AND excluded.next_slot
                     THEN p.next_slot ELSE excluded.next_slot END,
    checked_at = now(),
    updated_at = CASE WHEN p.schedule = excluded.schedule AND p.type = excluded.type
                      THEN p.updated_at ELSE now() END
RETURNING p.name, p.schedule, p.next_slot
