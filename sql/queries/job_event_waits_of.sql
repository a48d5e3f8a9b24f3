-- The event waits of job $1, in the order its handler reached them.
SELECT seq, name, deadline, event_id, data::text AS data, timed_out, attempt, waited_at,
       delivered_at
FROM {schema}.job_event_waits
WHERE job_id = $1
ORDER BY seq
