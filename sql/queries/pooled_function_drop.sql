-- Drop the pooled function {signature} (a row of pooled_functions_unused.sql).
DROP FUNCTION IF EXISTS {signature}
