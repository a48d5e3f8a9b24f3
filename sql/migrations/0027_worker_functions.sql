-- Each worker says which pooled functions it calls. Through a transaction pooler a worker runs
-- its statements as functions of the schema, `_pooled_<statement>_<digest>`, named after a
-- digest of their text and the schema's version: every release makes its own, and a rolling
-- upgrade's older workers keep calling theirs. `migrate` drops those that neither its own
-- release nor any registered worker calls (pooled_functions_unused.sql), which it can know only
-- when every worker says: NULL is a worker of a release before this one, which does not (while
-- one is registered, none is dropped); '{}' one that calls none (a direct worker).
ALTER TABLE {schema}.workers ADD COLUMN functions text[];
