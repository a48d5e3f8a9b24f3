-- The "needs attention" lists (issue 25): failed and cancelled jobs, newest first, and their
-- counts, read along a partial index of their ids, so that finding them no longer reads the
-- whole of `jobs` (1M rows of which 3,000 failed: 56 ms and 27,000 buffers, now under 1 ms for a
-- page). Only failed and cancelled rows have an entry: a job that completes adds none (its
-- updates already change `status`, which the claim index's predicate reads, so none of them is
-- HOT either way). Building it reads the table once under a SHARE lock: writes wait for that read
-- (about 0.2 s per million rows in memory), reads do not.
CREATE INDEX jobs_needs_attention_idx ON {schema}.jobs (id)
    WHERE status IN ('failed', 'cancelled');
