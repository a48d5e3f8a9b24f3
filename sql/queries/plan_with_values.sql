-- For the rest of the transaction, a prepared statement is planned with its values and the tables'
-- sizes at each run: in a session that is not the worker's (a transactional step's, where the
-- user's statements run too), a plan cached while `jobs` was nearly empty would read it whole
-- once it has filled, until the table is next analysed.
SET LOCAL plan_cache_mode = force_custom_plan
