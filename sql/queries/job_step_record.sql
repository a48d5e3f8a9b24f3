-- Record step $4 of job $1 with its result ($5, JSON text), started at $6 (NULL: when the
-- transaction began, for a step that runs in this transaction). Fenced by the attempt: only
-- while job $1 is still running attempt $2 claimed at $3, its row locked (FOR SHARE) until the
-- transaction ends, so that a rescue or an outcome cannot slip between the check and the commit.
-- A transactional step gives $7, the id of the transaction it began in (step_transaction.sql):
-- nothing is written unless this statement runs in that same transaction.
-- One row: `result`, the stored result (this one, or the one recorded first when the name was
-- taken), NULL when nothing was written; `own`, false when the transaction is not $7's.
WITH own AS (
    SELECT $7::bigint IS NULL OR txid_current() = $7::bigint AS own
), held AS (
    SELECT id FROM {schema}.jobs, own
    WHERE own.own AND id = $1 AND status = 'running' AND attempts = $2 AND claimed_at = $3
    FOR SHARE OF jobs
), recorded AS (
    INSERT INTO {schema}.job_steps AS s (job_id, name, result, attempt, started_at, finished_at)
    SELECT id, $4, $5::jsonb, $2, coalesce($6::timestamptz, now()), clock_timestamp() FROM held
    ON CONFLICT (job_id, name) DO UPDATE SET result = s.result
    RETURNING s.result::text AS result
)
SELECT (SELECT result FROM recorded) AS result, own.own FROM own
