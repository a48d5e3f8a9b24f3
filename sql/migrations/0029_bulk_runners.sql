-- Who runs a bulk action, so that one whose runner went away is taken over rather than left
-- running with nobody running it.
--
-- A runner (a console mounted in an application, `pgworker serve`, a worker leading maintenance,
-- or `pgworker replay/cancel --filter` in the foreground) takes the running actions that are free:
-- never taken, already its own, or whose owner's lease has lapsed (sql/queries/bulk_actions_claim.sql).
-- It records its id in `runner`, what it is in `runner_kind`, since when it holds the action in
-- `runner_since`, and renews `lease_until` (now + its lease, 30 s unless PGWORKER_BULK_LEASE says
-- otherwise) with every batch and every look for work; a runner killed stops renewing, and once
-- `lease_until` has passed any other runner adopts the action and resumes it after its last
-- committed batch. A batch runs only under its action's owner (bulk_action_lock.sql), so two
-- runners never alternate on one action.
--
-- Locks: four nullable columns without a default, added in one ALTER (catalog only, no rewrite).
ALTER TABLE {schema}.bulk_actions
    ADD COLUMN runner       text,
    ADD COLUMN runner_kind  text CHECK (runner_kind IN ('console', 'serve', 'worker', 'cli')),
    ADD COLUMN runner_since timestamptz,
    ADD COLUMN lease_until  timestamptz;
