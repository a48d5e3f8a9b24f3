-- The limits (pgworker queue limit) of the queues $1 that hold their due jobs back now: each
-- queue with a limit, its jobs running (counted along jobs_lease_idx, as the limited claim counts
-- them) against its `max_running`, and the starts of its rate window within the last
-- `rate_period` seconds (the window rate_next.sql reads) against its `rate_limit`. What the job
-- lists say of a waiting job: "held by limit".
SELECT c.name AS queue, c.max_running, c.rate_limit, c.rate_period,
       (SELECT count(*) FROM {schema}.jobs AS j
        WHERE c.max_running IS NOT NULL AND j.lease_expires_at IS NOT NULL
          AND j.status = 'running' AND j.queue = c.name) AS running,
       (SELECT count(*) FROM {schema}.rate_windows AS w, unnest(w.starts) AS s(at)
        WHERE c.rate_limit IS NOT NULL AND w.name = 'queue:' || c.name
          AND s.at > statement_timestamp() - make_interval(secs => c.rate_period)
          AND s.at <= statement_timestamp()) AS starts
FROM {schema}.queues AS c
WHERE c.name = ANY($1::text[]) AND (c.max_running IS NOT NULL OR c.rate_limit IS NOT NULL)
