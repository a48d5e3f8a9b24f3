-- For the rest of the transaction, a statement that reads a whole table may scan it, on a pool
-- whose sessions plan by index only (connection.create_pool, `keyed`).
SET LOCAL enable_seqscan = on
