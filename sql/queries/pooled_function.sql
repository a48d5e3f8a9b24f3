-- A pooled function (see Queries.pooled_functions): the worker statement {statement} as a
-- function of the schema, so that through a transaction pooler, where no statement stays
-- prepared, its plan is still made once per server session (PL/pgSQL keeps it) rather than at
-- every execution. Its SET clauses are the settings of a direct worker's sessions; its last
-- argument, the lock timeout of the transaction in ms (NULL: the server's), is set before it
-- runs. It returns the statement's rows as they are.
CREATE FUNCTION {schema}.{function}({parameters}, text)
RETURNS TABLE ({columns})
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $pooled$
#variable_conflict use_column
BEGIN
    IF ${timeout} IS NOT NULL THEN
        PERFORM set_config('lock_timeout', ${timeout}, true);
    END IF;
    RETURN QUERY {body};
END
$pooled$
