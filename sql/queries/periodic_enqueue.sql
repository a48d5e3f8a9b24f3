-- Enqueue the due slots of a schedule set in one statement, and move each schedule's row past
-- them. $1 the worker, $2 its lease; the jobs: $3-$10, aligned, schedule name, type, queue,
-- priority, payload (JSON text), slot, idempotency key, payload version; the rows: $11-$16,
-- aligned, name, type, definition, next slot, last slot enqueued and its key (NULL: none now).
-- Fenced by the lease: nothing is written unless $1 holds it. A slot whose key exists already
-- (enqueued by the leader before a handover, or by another fleet defining the same name) is
-- not inserted again: the unique idempotency key makes each slot one job. A row only moves
-- forward: its next slot and last slot never go back (a late leader of the same definition).
-- A last slot at or past the next slot was set by hand ('infinity'): the slot enqueued now
-- replaces it.
-- The inserts wake the workers through the jobs trigger, as any enqueue does.
WITH lease AS (
    SELECT FROM {schema}.leader WHERE name = $2 AND worker_id = $1 AND expires_at > now()
), ins AS (
    INSERT INTO {schema}.jobs AS j (type, queue, payload, priority, idempotency_key,
                                    fingerprint, correlation_id, run_at, version, scheduled_at)
    SELECT d.type, d.queue, d.payload::jsonb, d.priority, d.key,
           {schema}.fingerprint(d.type, d.payload::jsonb), gen_random_uuid()::text, d.slot,
           d.version, d.slot
    FROM unnest($3::text[], $4::text[], $5::text[], $6::integer[], $7::text[],
                $8::timestamptz[], $9::text[], $10::integer[])
         AS d(name, type, queue, priority, payload, slot, key, version)
    WHERE EXISTS (SELECT FROM lease)
    ORDER BY d.slot, d.name
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING j.idempotency_key
), moved AS (
    INSERT INTO {schema}.periodic AS p (name, type, schedule, next_slot, last_slot, last_key)
    SELECT s.name, s.type, s.schedule, s.next_slot, s.last_slot, s.last_key
    FROM unnest($11::text[], $12::text[], $13::text[], $14::timestamptz[],
                $15::timestamptz[], $16::text[])
         AS s(name, type, schedule, next_slot, last_slot, last_key)
    WHERE EXISTS (SELECT FROM lease)
    ORDER BY s.name
    ON CONFLICT (name) DO UPDATE
    SET type = excluded.type,
        schedule = excluded.schedule,
        next_slot = CASE WHEN p.schedule = excluded.schedule
                         THEN greatest(p.next_slot, excluded.next_slot)
                         ELSE excluded.next_slot END,
        last_slot = CASE WHEN excluded.last_slot IS NULL
                                OR (p.last_slot > excluded.last_slot
                                    AND p.last_slot < excluded.next_slot)
                         THEN p.last_slot ELSE excluded.last_slot END,
        last_key = CASE WHEN excluded.last_slot IS NULL
                               OR (p.last_slot > excluded.last_slot
                                   AND p.last_slot < excluded.next_slot)
                        THEN p.last_key ELSE excluded.last_key END,
        checked_at = now(),
        updated_at = now()
    RETURNING p.name
)
SELECT EXISTS (SELECT FROM lease) AS leading,
       (SELECT count(*) FROM moved) AS moved,
       coalesce((SELECT array_agg(idempotency_key) FROM ins), '{}') AS created
