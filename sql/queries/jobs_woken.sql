-- Of the jobs $1 whose attempts just ended `waiting` (ctx.wait_for_event), those due now: an
-- emit delivered their event while the attempt still ran (job_finish_many.sql made them due, and
-- the emit's notification came before they were claimable). Run only for waiting outcomes.
SELECT id FROM {schema}.jobs WHERE id = ANY($1::bigint[]) AND status = 'pending' AND run_at <= now()
