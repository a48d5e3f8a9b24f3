-- Periodic jobs (issue 23, item 1). Numbered 14: migration 13 belongs to pausing queues.
--
-- jobs.scheduled_at: the slot a periodic job was enqueued for (NULL for every other job), read
-- by handlers as ctx.scheduled_at. Adding a nullable column without a default rewrites nothing.
ALTER TABLE {schema}.jobs ADD COLUMN scheduled_at timestamptz;

-- One row per schedule name, written only by the worker that holds the schedule set's lease
-- (the `leader` row named 'periodic:<hash of the set>'). `next_slot` is where the next pass
-- starts: the slots from it up to now are due. `last_slot` and `last_key` are the last slot
-- enqueued and its job's idempotency key (the job is found by that key, whoever inserted it).
-- `checked_at` is when a leader defining this schedule last looked at it: a row no fleet
-- defines any more keeps its last value (the schedule was removed from the code).
CREATE TABLE {schema}.periodic (
    name       text PRIMARY KEY,
    type       text        NOT NULL,
    schedule   text        NOT NULL,
    next_slot  timestamptz NOT NULL,
    last_slot  timestamptz,
    last_key   text,
    created_at timestamptz NOT NULL DEFAULT now(),
    checked_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
