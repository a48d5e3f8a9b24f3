-- Write a batch of attempt outcomes ($1-$12, one array per field, aligned; $12 the handler's
-- run time in ms, migration 23); returns the ids
-- written, each with the outcome its attempt row got. Each is fenced by the attempt it owns: a job is changed only while it is still running
-- that attempt, claimed at that time (a claim lost in a server crash lets the next one reuse its
-- number), and its attempt row is closed in the same statement. A job whose cancellation was
-- asked for and that did not complete ends `cancelled`, whatever else its attempt reported
-- (failed, retried, timed out, snoozed, interrupted): never requeued, never counted as a retry,
-- never replayed with the failed ones, its attempt closed as `cancelled`. A completion stays
-- completed: the work was done. An outcome missing from the result was dropped. A completed job's error is cleared (the errors of
-- its earlier attempts stay in job_attempts); an outcome without an error (a snooze, a stop)
-- leaves the job's as it was. The attempt row gets the error's redacted traceback
-- (error_detail): every error text arrives redacted (see pgworker/_redact.py). A `waiting`
-- outcome (ctx.wait_for_event, migration 0020) parks the job until its wait's deadline (delay
-- 'Infinity': for good), unless an emit woke the job after this attempt's claim (woken_at): the
-- emit's update and this one lock the job's row, so whichever comes second reads the first's.
-- An error's group (migration 30, error_group: its fingerprint) is computed once per outcome,
-- written on the job with its error (cleared with it) and on the attempt with its error.
--
-- Both updates are driven by the batch, one primary-key probe per outcome, so that the cost stays
-- linear in the batch whatever its size: the generic plan cannot know it, and a completer that
-- fell behind writes batches of hundreds. Each probe matches its key by `= ANY(ARRAY[...])`, which
-- no merge or hash join can use: the plan has no other way to join than the probes, even one made
-- while the tables were empty (on an empty table a scan of the whole primary key, joined by filter,
-- costs less, and a cached plan would keep it once the table fills).
WITH done AS (
    UPDATE {schema}.jobs AS j
    SET status = CASE WHEN o.status <> 'completed' AND j.cancel_requested_at IS NOT NULL
                      THEN 'cancelled' ELSE o.status END,
        result = CASE WHEN o.status = 'completed' THEN o.result::jsonb ELSE j.result END,
        error = CASE WHEN o.status = 'completed' THEN NULL
                     WHEN o.error_type IS NULL THEN j.error
                     ELSE o.error_type || coalesce(': ' || nullif(o.error_message, ''), '') END,
        error_group = CASE WHEN o.status = 'completed' THEN NULL
                           WHEN o.error_type IS NULL THEN j.error_group
                           ELSE {schema}.error_group(j.type, o.error_type, o.error_message,
                                                     o.error_detail) END,
        retry_count = j.retry_count + CASE WHEN j.cancel_requested_at IS NULL THEN o.retried
                                           ELSE 0 END,
        run_at = CASE WHEN o.status <> 'pending' OR j.cancel_requested_at IS NOT NULL
                      THEN j.run_at
                      WHEN o.outcome <> 'waiting' THEN now() + make_interval(secs => o.delay)
                      -- An emit delivered to the job since this attempt's claim: due now.
                      WHEN j.woken_at >= j.claimed_at THEN now()
                      WHEN o.delay = 'Infinity' THEN 'infinity'
                      ELSE now() + make_interval(secs => o.delay) END,
        finished_at = CASE WHEN o.status = 'pending' AND j.cancel_requested_at IS NULL THEN NULL
                           ELSE now() END,
        lease_expires_at = NULL,
        updated_at = now()
    FROM unnest($1::bigint[], $2::integer[], $3::text[], $4::text[], $5::text[], $6::text[],
                $7::text[], $8::float8[], $9::integer[], $10::timestamptz[], $11::text[],
                $12::float8[])
         AS o(id, attempt, status, outcome, result, error_type, error_message, delay, retried,
              claimed_at, error_detail, run_ms)
    WHERE j.id = ANY(ARRAY[o.id]) AND j.status = 'running' AND j.attempts = o.attempt
      AND j.claimed_at = o.claimed_at
    RETURNING j.id, j.attempts,
              CASE WHEN j.status = 'cancelled' THEN 'cancelled' ELSE o.outcome END AS outcome,
              o.error_type, o.error_message, o.error_detail, o.run_ms,
              CASE WHEN o.error_type IS NOT NULL AND o.status <> 'completed'
                   THEN j.error_group END AS error_group
), closed AS (
    UPDATE {schema}.job_attempts AS a
    SET outcome = d.outcome, finished_at = now(), error_type = d.error_type,
        error_message = d.error_message, error_detail = d.error_detail, run_ms = d.run_ms,
        error_group = d.error_group
    FROM done AS d
    WHERE a.job_id = ANY(ARRAY[d.id]) AND a.attempt = d.attempts
)
SELECT id, outcome FROM done
