-- The index of leases is keyed on holding one, no longer on `status = 'running'` (the same rows:
-- a claim sets the lease, every write that ends an attempt clears it). The fences of the outcome
-- and heartbeat writes say `status = 'running'`; with the old predicate the planner could answer
-- them by scanning this partial index, whose dead entries pile up between vacuums, and join the
-- batch by filter, which costs the batch's size times the index's. Now only the rescue uses it,
-- and those writes probe the primary key once per job.
DROP INDEX {schema}.jobs_running_lease_idx;
CREATE INDEX jobs_lease_idx ON {schema}.jobs (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;
