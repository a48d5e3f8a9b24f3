-- The id of the transaction a transactional step runs in, read before its function runs: the
-- checkpoint is written only if it is still the same (job_step_record.sql), so that a function
-- that ended the transaction by a path the connection's guard cannot see is not recorded.
SELECT txid_current()
