-- The claim reads each served (queue, type, version) on its own, so that pending jobs of types a
-- worker does not serve cost its claim nothing (issue 22): the index of pending jobs is keyed by
-- queue, type and version before the claim order, and replaces the one keyed by queue alone.
-- Building it reads the whole table under a SHARE lock (enqueues, claims and outcomes wait; reads
-- do not). On a big table, build it beforehand with CREATE INDEX CONCURRENTLY, this name and these
-- columns: this migration then keeps it (the CHANGELOG's entry says how).
CREATE INDEX IF NOT EXISTS jobs_claim_type_idx
    ON {schema}.jobs (queue, type, version, priority DESC, run_at, id)
    WHERE status = 'pending';
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_index
               WHERE indexrelid = to_regclass('{schema}.jobs_claim_type_idx') AND NOT indisvalid)
    THEN
        RAISE EXCEPTION 'the index %.jobs_claim_type_idx is invalid (a CREATE INDEX CONCURRENTLY '
                        'that failed): drop it, then migrate again', '{schema}';
    END IF;
END $$;
DROP INDEX {schema}.jobs_claim_idx;
