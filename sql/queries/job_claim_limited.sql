-- Claim up to $4 due jobs of one (queue $1, type $2, version $3) that has limits, inside a
-- transaction that holds the advisory locks of those limits (limits_lock.sql): each limit's room
-- is counted here from the table itself, and no other limited claim of the same limits runs until
-- this one commits. The limits: the task's max_running ($10), max_running_per_key ($11) and rate
-- ($12 starts per $13 seconds), declared in the worker's code; the queue's max_running and rate,
-- from its `queues` row (none without a row; nothing at all while paused).
-- $14 says whether limits_lock.sql found the queue limited, and so holds its lock: a queue whose
-- limits appeared since is left out of this claim, as the plain claim leaves it out (two claims
-- counting its room without its lock would both see the same room).
-- $5-$9 are the plain claim's: worker id, lease, the task's max_retries, code version,
-- synchronous_commit; the claimed jobs become running, and come back, as every claim's do
-- (_claimed.sql, _claimed_rows.sql).
--
-- The claim's time is this statement's start, taken after the locks: a later claim of the same
-- limits always sees a later time, so that the rate windows (rate_windows, a sliding window of
-- the last starts) never count a start in the wrong order. It is the attempt's started_at.
--
-- With a per-key limit, the keys take turns: the claim walks the keys that have pending jobs in
-- key order from the one after the last key served (key_cursors), wrapping around, and stops once
-- it has found as many keys with room and a due job as it has room for; it takes each key's first
-- jobs (as many as the key's room), then each key's second job, and so on. The walk is a skip scan
-- of jobs_claim_key_idx that PostgreSQL runs only as far as the LIMIT needs: one probe per key
-- passed, whatever the number of keys or their backlog. Jobs of the task that have no key are not
-- limited per key: they are claimed in order among the first 50 pending jobs of the (queue, type,
-- version), keys or not.
WITH RECURSIVE at AS MATERIALIZED (
    SELECT statement_timestamp() AS t
), claim AS NOT MATERIALIZED (
    -- What the shared end (_claimed.sql) writes.
    SELECT $5::text AS worker_id, $6::float8 AS lease, $8::text AS code_version,
           $9::text AS synchronous_commit, (SELECT t FROM at) AS at,
           ARRAY[$2::text] AS types, ARRAY[$7::integer] AS max_retries
), ctl AS MATERIALIZED (
    SELECT c.paused_at IS NOT NULL
           OR (c.max_running IS NOT NULL OR c.rate_limit IS NOT NULL) AND NOT $14::boolean
           AS shut,
           c.max_running, c.rate_limit, c.rate_period
    FROM (SELECT 1) AS one
    LEFT JOIN {schema}.queues AS c ON c.name = $1
), running AS MATERIALIZED (
    -- Running jobs hold a lease: the lease index lists them all. Each count is read only when
    -- its limit is set.
    SELECT (SELECT count(*) FROM {schema}.jobs AS j
            WHERE j.lease_expires_at IS NOT NULL AND j.status = 'running' AND j.type = $2
              AND $10::integer IS NOT NULL) AS of_type,
           (SELECT count(*) FROM {schema}.jobs AS j
            WHERE j.lease_expires_at IS NOT NULL AND j.status = 'running' AND j.queue = $1
              AND (SELECT max_running FROM ctl) IS NOT NULL) AS of_queue
), rates AS MATERIALIZED (
    SELECT r.name, r.n, r.period,
           -- A start after this claim's time cannot be (the claims of a limit are serialized
           -- and their times grow): one written by hand is dropped here, not obeyed forever.
           ARRAY(SELECT s FROM unnest(w.starts) AS s
                 WHERE s > (SELECT t FROM at) - make_interval(secs => r.period)
                   AND s <= (SELECT t FROM at)
                 ORDER BY s) AS kept
    FROM (SELECT 'queue:' || $1, rate_limit, rate_period FROM ctl
          UNION ALL
          SELECT 'type:' || $2, $12::integer, $13::integer) AS r(name, n, period)
    LEFT JOIN {schema}.rate_windows AS w ON w.name = r.name
    WHERE r.n IS NOT NULL
), room AS MATERIALIZED (
    SELECT CASE WHEN (SELECT shut FROM ctl) THEN 0
                ELSE greatest(0, least(
                    $4::integer,
                    $10::integer - (SELECT of_type FROM running),
                    (SELECT max_running FROM ctl) - (SELECT of_queue FROM running),
                    (SELECT min(n - cardinality(kept)) FROM rates)))
           END AS n
), cursor AS MATERIALIZED (
    SELECT (SELECT c.last_key FROM {schema}.key_cursors AS c
            WHERE c.queue = $1 AND c.type = $2) AS last_key
), after_cursor(k, pos) AS (
    -- The keys after the last one served, in key order...
    (SELECT j.concurrency_key, 1
     FROM {schema}.jobs AS j
     WHERE j.status = 'pending' AND j.concurrency_key IS NOT NULL AND j.queue = $1
       AND j.type = $2 AND j.version = $3 AND $11::integer IS NOT NULL
       AND j.concurrency_key > coalesce((SELECT last_key FROM cursor), '')
     ORDER BY j.concurrency_key
     LIMIT 1)
    UNION ALL
    SELECT (SELECT j.concurrency_key
            FROM {schema}.jobs AS j
            WHERE j.status = 'pending' AND j.concurrency_key IS NOT NULL AND j.queue = $1
              AND j.type = $2 AND j.version = $3 AND j.concurrency_key > a.k
            ORDER BY j.concurrency_key
            LIMIT 1),
           a.pos + 1
    FROM after_cursor AS a
    WHERE a.k IS NOT NULL
), up_to_cursor(k, pos) AS (
    -- ...then, wrapping around, those up to it (itself last).
    (SELECT j.concurrency_key, 1
     FROM {schema}.jobs AS j
     WHERE j.status = 'pending' AND j.concurrency_key IS NOT NULL AND j.queue = $1
       AND j.type = $2 AND j.version = $3 AND $11::integer IS NOT NULL
       AND j.concurrency_key <= (SELECT last_key FROM cursor)
     ORDER BY j.concurrency_key
     LIMIT 1)
    UNION ALL
    SELECT (SELECT j.concurrency_key
            FROM {schema}.jobs AS j
            WHERE j.status = 'pending' AND j.concurrency_key IS NOT NULL AND j.queue = $1
              AND j.type = $2 AND j.version = $3 AND j.concurrency_key > u.k
              AND j.concurrency_key <= (SELECT last_key FROM cursor)
            ORDER BY j.concurrency_key
            LIMIT 1),
           u.pos + 1
    FROM up_to_cursor AS u
    WHERE u.k IS NOT NULL
), key_running AS MATERIALIZED (
    -- One object, key -> running jobs: each key the walk passes finds its count by a binary
    -- search of it. (A scan of a list of every running key per key passed is quadratic: 3,000
    -- keys at their limit took seconds.)
    SELECT coalesce(jsonb_object_agg(r.k, r.n), '{}') AS n
    FROM (SELECT j.concurrency_key AS k, count(*) AS n
          FROM {schema}.jobs AS j
          WHERE j.lease_expires_at IS NOT NULL AND j.status = 'running' AND j.type = $2
            AND j.concurrency_key IS NOT NULL AND $11::integer IS NOT NULL
          GROUP BY j.concurrency_key) AS r
), visited AS (
    -- Only as many keys as the claim has room for: the walk above goes no further.
    SELECT r.k, r.pos, r.room
    FROM (
        SELECT w.k, w.pos,
               $11::integer - coalesce(((SELECT n FROM key_running) ->> w.k)::bigint, 0)
               AS room
        FROM (SELECT k, pos FROM after_cursor WHERE k IS NOT NULL
              UNION ALL
              SELECT k, 1000000000 + pos FROM up_to_cursor WHERE k IS NOT NULL) AS w
    ) AS r
    WHERE r.room > 0
      -- A probe of jobs_claim_key_idx per key, in its order: an EXISTS may become a semi-join
      -- that hashes every pending job of the task, and a probe in no order a sequential scan
      -- (100,000 jobs of one key: all read at each claim).
      AND (SELECT true FROM {schema}.jobs AS j
           WHERE j.status = 'pending' AND j.concurrency_key = r.k AND j.queue = $1
             AND j.type = $2 AND j.version = $3 AND j.run_at <= (SELECT t FROM at)
           ORDER BY j.priority DESC, j.run_at, j.id
           LIMIT 1)
      AND (SELECT n FROM room) > 0
    LIMIT (SELECT n FROM room)
), candidates AS (
    SELECT c.id, c.priority, c.run_at, c.concurrency_key,
           row_number() OVER (PARTITION BY v.k ORDER BY c.priority DESC, c.run_at, c.id) AS turn,
           v.pos
    FROM visited AS v
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at, j.concurrency_key
        FROM {schema}.jobs AS j
        WHERE j.status = 'pending' AND j.concurrency_key = v.k AND j.queue = $1
          AND j.type = $2 AND j.version = $3 AND j.run_at <= (SELECT t FROM at)
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT least(v.room, (SELECT n FROM room))
    ) AS c
    UNION ALL
    SELECT f.id, f.priority, f.run_at, NULL,
           row_number() OVER (ORDER BY f.priority DESC, f.run_at, f.id), 0
    FROM (
        SELECT j.id, j.priority, j.run_at, j.concurrency_key
        FROM {schema}.jobs AS j
        WHERE j.status = 'pending' AND j.queue = $1 AND j.type = $2 AND j.version = $3
          AND j.run_at <= (SELECT t FROM at) AND (SELECT n FROM room) > 0
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT CASE WHEN $11::integer IS NULL THEN (SELECT n FROM room) ELSE 50 END
    ) AS f
    WHERE $11::integer IS NULL OR f.concurrency_key IS NULL
), next AS MATERIALIZED (
    -- Locked only once chosen: the claims of these limits wait on the advisory locks, so the
    -- row locks only keep out claims that ignore them (another release, an HTTP worker).
    SELECT j.id
    FROM {schema}.jobs AS j
    WHERE j.id = ANY(ARRAY(
            SELECT c.id FROM candidates AS c
            ORDER BY c.turn, c.pos, c.priority DESC, c.run_at, c.id
            LIMIT (SELECT n FROM room)))
      AND j.status = 'pending'
    FOR UPDATE SKIP LOCKED
), {claimed}, counted AS (
    SELECT count(*)::integer AS n FROM claimed
), rated AS (
    INSERT INTO {schema}.rate_windows AS w (name, starts, updated_at)
    SELECT r.name, r.kept || array_fill((SELECT t FROM at), ARRAY[c.n]), (SELECT t FROM at)
    FROM rates AS r, counted AS c
    WHERE c.n > 0
    ON CONFLICT (name) DO UPDATE SET starts = EXCLUDED.starts, updated_at = EXCLUDED.updated_at
), turned AS (
    -- The round-robin goes on after the furthest key this claim served.
    INSERT INTO {schema}.key_cursors AS k (queue, type, last_key, updated_at)
    SELECT $1, $2, v.k, (SELECT t FROM at)
    FROM visited AS v
    WHERE v.k IN (SELECT c.concurrency_key FROM claimed AS c)
    ORDER BY v.pos DESC
    LIMIT 1
    ON CONFLICT (queue, type) DO UPDATE
    SET last_key = EXCLUDED.last_key, updated_at = EXCLUDED.updated_at
)
{claimed_rows}
