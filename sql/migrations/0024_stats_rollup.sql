-- The charts' per-minute rollup (issue 25, item 4): the console's charts read whole minutes from
-- here and only the minutes not rolled up yet from job_attempts and jobs, so that a chart of a
-- day costs the same on a table of five million attempts as on an empty one.
--
-- `stats_minutes` holds, per minute (aligned on the epoch) and per queue and type, what the
-- charts show: jobs enqueued (jobs.created_at in the minute), attempts started in the minute that
-- completed and that failed, and histograms of their wait and run times. Each minute has a row
-- for every (queue, type) seen, and one per queue (type ''), per type (queue '') and for all
-- (both ''): '' is no queue or type name (names are never empty), so each chart reads one range
-- of the primary key, at most 1,440 rows for a day. A histogram is sparse: the buckets that
-- hold any attempt (`*_buckets`, ascending) and their counts (`*_counts`, aligned); bucket 0 is
-- under 0.1 ms, bucket k >= 1 is [0.1 ms * 2^((k-1)/4), 0.1 ms * 2^(k/4)) (pgworker/_web/
-- charts.py). `*_min` and `*_max` bound the values (a percentile is never shown outside them).
--
-- `stats_rollup` has one row per minute rolled up (also those with nothing in them), with the
-- attempts still running then: a minute with any is read from job_attempts until rolled up
-- again. Written by the maintenance leader only (sql/queries/stats_rollup.sql); pruned with the
-- finished jobs' retention. New tables: no lock on any existing one.
CREATE TABLE {schema}.stats_minutes (
    queue        text        NOT NULL,
    type         text        NOT NULL,
    minute       timestamptz NOT NULL,
    enqueued     integer     NOT NULL,
    completed    integer     NOT NULL,
    failed       integer     NOT NULL,
    wait_min     float8,
    wait_max     float8,
    run_min      float8,
    run_max      float8,
    wait_buckets smallint[]  NOT NULL,
    wait_counts  integer[]   NOT NULL,
    run_buckets  smallint[]  NOT NULL,
    run_counts   integer[]   NOT NULL,
    PRIMARY KEY (queue, type, minute)
);
-- A minute's rows (rolling it up again, pruning).
CREATE INDEX stats_minutes_minute_idx ON {schema}.stats_minutes (minute);

CREATE TABLE {schema}.stats_rollup (
    minute    timestamptz PRIMARY KEY,
    rolled_at timestamptz NOT NULL,
    running   integer     NOT NULL
);
