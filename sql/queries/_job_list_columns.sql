-- The columns of a row of the job lists (jobs_filtered.sql, jobs_sorted.sql), of the jobs row `j`
-- joined with its last attempt `a` and its open event wait `w`: no payload or result (one may
-- hold 64 MB); its error's first line and its last attempt's traceback; `run_s`, the last
-- attempt's run time in seconds (the handler's, as _attempt_times.sql counts it); `event` and
-- `event_deadline`, the event a pending job waits for (ctx.wait_for_event: its last wait, while
-- no event was delivered to it and it did not time out) and until when (NULL: for good).
j.id, j.type, j.queue, j.status, j.priority, j.attempts, j.retry_count, j.max_retries,
j.correlation_id, j.run_at, j.created_at, j.updated_at, j.finished_at, j.worker_id,
left(split_part(j.error, E'\n', 1), 500) AS error,
CASE WHEN j.error IS NOT NULL THEN left(a.error_detail, 8000) END AS error_detail,
j.progress ->> 'milestone' AS milestone,
coalesce(a.run_ms / 1000.0, date_part('epoch', a.finished_at - a.started_at))::float8 AS run_s,
CASE WHEN w.event_id IS NULL AND NOT w.timed_out THEN w.name END AS event,
CASE WHEN w.event_id IS NULL AND NOT w.timed_out THEN w.deadline END AS event_deadline
