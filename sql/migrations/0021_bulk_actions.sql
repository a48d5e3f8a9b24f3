-- Bulk actions over a filter (issue 25, item 3): replay, cancel, delete or reschedule every job
-- that a filter of the job lists matches, run in the background in short batches.
--
-- One row per action. `filter` holds the filter as the job lists take it (the keys of
-- GET /jobs's query); `max_id`, the highest job id when the action was created, fixes the set it
-- may touch: jobs enqueued later are never swept in. Each batch takes the next matching ids above
-- `cursor` (the last id handled), acts on them and moves `cursor`, `done` and `skipped` forward
-- in one short transaction, under this row's lock: a batch commits whole or not at all, so an
-- action interrupted (a server killed) resumes where its last batch ended, and no job is handled
-- twice. `matched` is the count of matching jobs when the action was created.
--
-- Locks: a new table only; `jobs` is not touched.
CREATE TABLE {schema}.bulk_actions (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text        NOT NULL CHECK (kind IN ('replay', 'cancel', 'delete', 'reschedule')),
    filter      jsonb       NOT NULL,
    run_at      timestamptz CHECK ((kind = 'reschedule') = (run_at IS NOT NULL)),
    max_id      bigint      NOT NULL,
    matched     bigint      NOT NULL CHECK (matched >= 0),
    done        bigint      NOT NULL DEFAULT 0 CHECK (done >= 0),
    skipped     bigint      NOT NULL DEFAULT 0 CHECK (skipped >= 0),
    cursor      bigint      NOT NULL DEFAULT 0,
    state       text        NOT NULL DEFAULT 'running'
                CHECK (state IN ('running', 'done', 'failed')),
    error       text,
    actor       text        NOT NULL,
    reason      text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
-- The actions left to run (a server resuming them at start-up).
CREATE INDEX bulk_actions_running_idx ON {schema}.bulk_actions (id) WHERE state = 'running';
