-- For the rest of the transaction, plans for the charts' statements (stats_window.sql,
-- stats_rollup.sql): bitmap scans on, since they read time ranges along BRIN indexes, which
-- only a bitmap scan can use (the pools turn bitmap scans off: connection.create_pool), and no
-- JIT, which a generic plan's guess of a range it cannot see (a share of the table) would turn
-- on: compiling costs some 80 ms, reading a minute's rows a few.
SELECT set_config('enable_bitmapscan', 'on', true), set_config('jit', 'off', true)
