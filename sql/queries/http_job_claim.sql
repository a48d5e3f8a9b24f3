-- Claim one due job for an HTTP worker ($1 worker_id): of the queues $2 (NULL: any), of the types
-- $3 (NULL: any), and, for the types listed in $4, only the versions `type@version` of $5 (the
-- claim's `versions` object; other types: any version). Highest priority first, then oldest run_at,
-- then id, as the Python runtime claims. The job gets an attempt row and a lease of $6 seconds, and
-- max_retries $7 (RetryPolicy()'s) where the enqueuer gave none, as every claim's jobs do
-- (_claimed.sql). The claim commits only once its WAL is flushed (synchronous_commit on, whatever
-- the server's default): an HTTP worker holds nothing but the attempt number, so a claim lost in a
-- crash must not let another reuse that number.
-- Jobs of a paused queue (queues.paused_at set) are not claimed, nor those of a queue with a limit
-- (max_running, a rate): only Python workers claim them, under the limit's lock. Limits that a
-- task declares in Python code are not known here.
WITH next AS MATERIALIZED (
    SELECT j.id, j.type
    FROM {schema}.jobs AS j
    WHERE j.status = 'pending' AND j.run_at <= now()
      AND ($2::text[] IS NULL OR j.queue = ANY($2::text[]))
      AND ($3::text[] IS NULL OR j.type = ANY($3::text[]))
      AND (NOT j.type = ANY($4::text[]) OR j.type || '@' || j.version = ANY($5::text[]))
      AND j.queue <> ALL (ARRAY(SELECT c.name FROM {schema}.queues AS c
                                WHERE c.paused_at IS NOT NULL OR c.max_running IS NOT NULL
                                   OR c.rate_limit IS NOT NULL))
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), claim AS NOT MATERIALIZED (
    SELECT $1::text AS worker_id, $6::float8 AS lease, NULL::text AS code_version,
           'on'::text AS synchronous_commit, now() AS at,
           ARRAY(SELECT n.type FROM next AS n) AS types, ARRAY[$7::integer] AS max_retries
), {claimed}
{claimed_rows}
