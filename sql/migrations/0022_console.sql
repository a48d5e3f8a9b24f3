-- The operator console (issue 25, items 4 and 5): its charts and its workers page.
--
-- The charts count the jobs enqueued per minute (sql/queries/stats_enqueued.sql) along a BRIN
-- index of jobs.created_at: jobs are written in time order, so a few kB cover a million rows. An
-- enqueue adds no index entry for it (a BRIN keeps one summary per range of pages, widened only
-- when a row lands in a range already summarized), and it stops no update from being HOT
-- (created_at never changes). Building it reads the table once under a SHARE lock: writes wait
-- for that read (about 0.2 s per million rows in memory), reads do not.
CREATE INDEX jobs_created_idx ON {schema}.jobs USING brin (created_at);

-- The workers page: each worker's lease in seconds (a worker not seen for longer is gone; NULL
-- for workers of earlier versions, which the page judges by a minute), and whether it claims
-- over the HTTP API (rather than running `pgworker run`). Catalog-only changes: nothing is
-- rewritten.
ALTER TABLE {schema}.workers
    ADD COLUMN lease float8 CHECK (lease > 0),
    ADD COLUMN http boolean NOT NULL DEFAULT false;
