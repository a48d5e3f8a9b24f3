-- The joins of a row of the job lists (_job_list_columns.sql) to the jobs row `j`: its last
-- attempt (one primary-key probe of job_attempts) and, for a pending job, its last event wait
-- (one probe of job_event_waits' primary key).
LEFT JOIN {schema}.job_attempts AS a ON a.job_id = j.id AND a.attempt = j.attempts
LEFT JOIN LATERAL (
    SELECT ew.name, ew.deadline, ew.event_id, ew.timed_out
    FROM {schema}.job_event_waits AS ew
    WHERE j.status = 'pending' AND ew.job_id = j.id
    ORDER BY ew.seq DESC
    LIMIT 1
) AS w ON true
