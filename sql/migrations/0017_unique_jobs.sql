-- Unique jobs (issue 24, item 1): while a job with the same unique_key, type and queue is in one
-- of its unique states (default pending and running) and, with a unique period, was enqueued in
-- the same period bucket, an enqueue with that key returns it (created = false) instead of
-- inserting. The unique index below decides, never a check-then-insert.
--
-- Three nullable columns without defaults: adding them rewrites nothing and takes the ACCESS
-- EXCLUSIVE lock only for an instant. Plain jobs leave them NULL.
--   unique_key     the key ("refresh-user-7"), 1 to 200 characters
--   unique_states  the states the key is held in, a bitmask: pending 1, running 2, completed 4,
--                  failed 8, cancelled 16 (always holds pending and running: 3)
--   unique_bucket  the start of the period bucket the job was enqueued in, or -infinity without
--                  a period (a NULL would be distinct from every other in the index, and NULLS
--                  NOT DISTINCT needs PostgreSQL 15)
ALTER TABLE {schema}.jobs
    ADD COLUMN unique_key    text CHECK (char_length(unique_key) BETWEEN 1 AND 200),
    ADD COLUMN unique_states smallint CHECK (unique_states & 3 = 3),
    ADD COLUMN unique_bucket timestamptz,
    ADD CONSTRAINT jobs_unique_whole CHECK (
        (unique_key IS NULL) = (unique_states IS NULL)
        AND (unique_key IS NULL) = (unique_bucket IS NULL));

-- Whether a job's status is one of the states of its mask. IMMUTABLE: the index predicate calls
-- it. Only rows with a unique key call it (the predicate tests that first).
CREATE FUNCTION {schema}.unique_state_in(mask smallint, status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT mask & CASE status WHEN 'pending' THEN 1 WHEN 'running' THEN 2 WHEN 'completed' THEN 4
                              WHEN 'failed' THEN 8 WHEN 'cancelled' THEN 16 ELSE 0 END <> 0
$$;

-- A job that leaves its unique states leaves the index by itself, and frees the key. The table
-- is empty of unique keys when this runs: the index is built from no rows (a SHARE lock while
-- it reads the table to find none: enqueues wait for that read, reads do not).
CREATE UNIQUE INDEX jobs_unique_idx ON {schema}.jobs (queue, type, unique_key, unique_bucket)
    WHERE unique_key IS NOT NULL AND {schema}.unique_state_in(unique_states, status);

-- The SQL function takes the unique arguments last (positional calls keep working), dropped and
-- created again with its grants carried over, as migration 16 did:
--     SELECT * FROM pgworker.enqueue('refresh-user', '{"user": 7}', unique_key => 'user-7');
-- unique_states (text[]), unique_period (interval) and replace (boolean) as enqueue() takes them.
SELECT set_config('pgworker.enqueue_acl', coalesce(p.proacl::text, ''), true)
FROM pg_proc AS p
WHERE p.oid = '{schema}.enqueue(text, jsonb, text, anycompatible, bigint, text, text, '
              'timestamptz, interval, bigint, text)'::regprocedure;

DROP FUNCTION {schema}.enqueue(text, jsonb, text, anycompatible, bigint, text, text,
                               timestamptz, interval, bigint, text);

CREATE FUNCTION {schema}.enqueue(
    type            text,
    payload         jsonb         DEFAULT '{}',
    queue           text          DEFAULT 'default',
    priority        anycompatible DEFAULT 0,
    max_retries     bigint        DEFAULT NULL,
    idempotency_key text          DEFAULT NULL,
    correlation_id  text          DEFAULT NULL,
    run_at          timestamptz   DEFAULT NULL,
    delay           interval      DEFAULT NULL,
    version         bigint        DEFAULT 1,
    concurrency_key text          DEFAULT NULL,
    unique_key      text          DEFAULT NULL,
    unique_states   text[]        DEFAULT NULL,
    unique_period   interval      DEFAULT NULL,
    replace         boolean       DEFAULT false
) RETURNS TABLE (id bigint, created boolean)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_type     text := enqueue.type;
    v_queue    text := coalesce(enqueue.queue, 'default');
    v_payload  jsonb := coalesce(nullif(enqueue.payload, 'null'), '{}');
    v_priority bigint;
    v_version  bigint := coalesce(enqueue.version, 1);
    v_key      text := enqueue.idempotency_key;
    v_run_at   timestamptz;
    v_seconds  numeric;
    v_bytes    bigint;
    v_digits   integer;
    v_setting  text := btrim(current_setting('pgworker.max_payload_bytes', true));
    v_limit    bigint := 67108864;
    v_fp       text;
    v_id       bigint;
    v_matches  boolean;
    v_field    text;
    v_problem  text;
    v_mask     smallint;
    v_period   float8;
    v_bucket   timestamptz;
    v_state    text;
    v_status   text;
    v_tries    integer := 0;
BEGIN
    -- The setting is read before the arguments: a wrong one refuses every call alike.
    IF v_setting <> '' THEN
        IF v_setting ~ '^[0-9]{1,18}$' THEN
            v_limit := v_setting::bigint;
        END IF;
        IF v_setting !~ '^[0-9]{1,18}$' OR v_limit < 1 THEN
            RAISE EXCEPTION USING ERRCODE = 'PGW02',
                MESSAGE = format('pgworker.max_payload_bytes: must be a whole number of bytes, '
                                 'at least 1 (e.g. 1048576 for 1 MB), got %s; change the '
                                 'setting, or RESET it for the default of 64 MB',
                                 quote_literal(v_setting));
        END IF;
    END IF;
    -- The checks in the order of enqueue._fields: the first refused argument is the one named.
    IF enqueue.run_at IS NOT NULL AND enqueue.delay IS NOT NULL THEN
        v_field := 'run_at'; v_problem := 'give run_at or delay, not both';
    ELSIF enqueue.run_at IS NOT NULL AND NOT (
        isfinite(enqueue.run_at)
        AND enqueue.run_at >= '0001-01-01 00:00:00+00'
        AND enqueue.run_at <= '9999-12-31 23:59:59.999999+00'
    ) THEN
        v_field := 'run_at';
        v_problem := format('is out of range once in UTC, got %s', enqueue.run_at);
    ELSIF enqueue.delay IS NOT NULL THEN
        v_seconds := extract(epoch FROM enqueue.delay);
        IF v_seconds < 0 THEN
            v_field := 'delay';
            v_problem := format('must be a finite number of seconds >= 0, got %s', enqueue.delay);
        ELSIF v_seconds > 315360000 THEN
            v_field := 'delay';
            v_problem := format('must be at most 315,360,000 seconds (10 years), got %s',
                                enqueue.delay);
        END IF;
    END IF;
    IF v_field IS NULL THEN
        IF v_type IS NULL OR v_type = '' THEN
            v_field := 'type';
            v_problem := format('must be a non-empty string, got %s',
                                coalesce(quote_literal(v_type), 'NULL'));
        ELSIF length(v_type) > 200 THEN
            v_field := 'type';
            v_problem := format('must be at most 200 characters, got %s characters',
                                length(v_type));
        ELSIF v_queue = '' THEN
            v_field := 'queue'; v_problem := 'must be a non-empty string, got ''''';
        ELSIF length(v_queue) > 63 THEN
            v_field := 'queue';
            v_problem := format('must be at most 63 characters, got %s characters',
                                length(v_queue));
        END IF;
    END IF;
    IF v_field IS NULL THEN
        IF enqueue.priority IS NULL THEN
            v_priority := 0;
        ELSIF pg_typeof(enqueue.priority) IN ('smallint'::regtype, 'integer', 'bigint') THEN
            v_priority := enqueue.priority::text::bigint;
            IF v_priority NOT BETWEEN -2147483648 AND 2147483647 THEN
                v_field := 'priority';
                v_problem := format('must be an int from -2147483648 to 2147483647, got %s',
                                    v_priority);
            END IF;
        ELSIF pg_typeof(enqueue.priority) IN ('text'::regtype, 'character varying',
                                              'character', 'name') THEN
            v_priority := CASE enqueue.priority::text
                WHEN 'low' THEN 0 WHEN 'medium' THEN 10 WHEN 'high' THEN 20 WHEN 'critical' THEN 30
            END;
            IF v_priority IS NULL THEN
                v_field := 'priority';
                v_problem := format(
                    'unknown label %s; use an int or one of low, medium, high, critical',
                    quote_literal(enqueue.priority::text));
            END IF;
        ELSE
            v_field := 'priority';
            v_problem := format('must be an int or a label, got %s (%s)',
                                enqueue.priority::text, pg_typeof(enqueue.priority));
        END IF;
    END IF;
    IF v_field IS NULL THEN
        IF enqueue.max_retries IS NOT NULL
           AND enqueue.max_retries NOT BETWEEN 0 AND 2147483647 THEN
            v_field := 'max_retries';
            v_problem := format('must be an int from 0 to 2147483647, got %s',
                                enqueue.max_retries);
        ELSIF v_key = '' THEN
            v_field := 'idempotency_key'; v_problem := 'must be a non-empty string, got ''''';
        ELSIF length(v_key) > 500 THEN
            v_field := 'idempotency_key';
            v_problem := format('must be at most 500 characters, got %s characters',
                                length(v_key));
        ELSIF enqueue.correlation_id = '' THEN
            v_field := 'correlation_id'; v_problem := 'must be a non-empty string, got ''''';
        ELSIF length(enqueue.correlation_id) > 200 THEN
            v_field := 'correlation_id';
            v_problem := format('must be at most 200 characters, got %s characters',
                                length(enqueue.correlation_id));
        ELSIF v_version NOT BETWEEN 1 AND 2147483647 THEN
            v_field := 'version';
            v_problem := format('must be an int from 1 to 2147483647, got %s', v_version);
        ELSIF enqueue.concurrency_key = '' THEN
            v_field := 'concurrency_key'; v_problem := 'must be a non-empty string, got ''''';
        ELSIF length(enqueue.concurrency_key) > 200 THEN
            v_field := 'concurrency_key';
            v_problem := format('must be at most 200 characters, got %s characters',
                                length(enqueue.concurrency_key));
        ELSIF enqueue.unique_key = '' THEN
            v_field := 'unique_key'; v_problem := 'must be a non-empty string, got ''''';
        ELSIF length(enqueue.unique_key) > 200 THEN
            v_field := 'unique_key';
            v_problem := format('must be at most 200 characters, got %s characters',
                                length(enqueue.unique_key));
        ELSIF enqueue.unique_key IS NOT NULL AND v_key IS NOT NULL THEN
            v_field := 'unique_key';
            v_problem := 'give idempotency_key or unique_key, not both (see "Unique jobs or '
                         'idempotency keys" in the guide)';
        ELSIF enqueue.unique_key IS NULL AND enqueue.unique_states IS NOT NULL THEN
            v_field := 'unique_states'; v_problem := 'needs a unique_key';
        ELSIF enqueue.unique_key IS NULL AND enqueue.unique_period IS NOT NULL THEN
            v_field := 'unique_period'; v_problem := 'needs a unique_key';
        ELSIF enqueue.unique_key IS NULL AND coalesce(enqueue.replace, false) THEN
            v_field := 'replace'; v_problem := 'needs a unique_key (replace updates the pending '
                                               'job holding that key)';
        END IF;
    END IF;
    IF v_field IS NULL AND enqueue.unique_key IS NOT NULL THEN
        v_mask := 0;
        FOREACH v_state IN ARRAY coalesce(enqueue.unique_states, '{pending,running}')
        LOOP
            IF v_state IS NULL OR v_state NOT IN ('pending', 'running', 'completed', 'failed',
                                                  'cancelled') THEN
                v_field := 'unique_states';
                v_problem := format('unknown state %s; use pending, running, completed, failed, '
                                    'cancelled', coalesce(quote_literal(v_state), 'NULL'));
                EXIT;
            END IF;
            v_mask := v_mask | CASE v_state WHEN 'pending' THEN 1 WHEN 'running' THEN 2
                                            WHEN 'completed' THEN 4 WHEN 'failed' THEN 8
                                            ELSE 16 END;
        END LOOP;
        IF v_field IS NULL AND v_mask & 3 <> 3 THEN
            v_field := 'unique_states';
            v_problem := format('must contain both pending and running (a job moves between '
                                'them on retry, snooze and rescue), got %s',
                                array_to_string(enqueue.unique_states, ', '));
        ELSIF v_field IS NULL AND v_mask > 3 AND enqueue.unique_period IS NULL THEN
            v_field := 'unique_states';
            v_problem := 'a final state (completed, failed, cancelled) needs a unique_period: '
                         'else the key would be held until the job is pruned';
        ELSIF v_field IS NULL AND enqueue.unique_period IS NOT NULL THEN
            v_period := extract(epoch FROM enqueue.unique_period)::float8;
            IF v_period < 0.001 OR v_period > 315360000 THEN
                v_field := 'unique_period';
                v_problem := format('must be a number of seconds > 0, at least 0.001 and at '
                                    'most 315,360,000 (10 years), got %s', enqueue.unique_period);
            END IF;
        END IF;
    END IF;
    IF v_field IS NULL THEN
        -- jsonb itself refuses NUL characters, lone surrogates and NaN before this runs.
        IF jsonb_path_exists(v_payload,
                             'strict $.**{500} ? (@.type() == "object" || @.type() == "array")')
        THEN
            v_field := 'payload';
            v_problem := 'must not nest lists and objects more than 500 deep';
        ELSE
            v_bytes := octet_length(v_payload::text);
            IF v_bytes > v_limit THEN
                v_field := 'payload';
                v_problem := format(
                    'is %s bytes as JSON, over the limit of %s (pgworker.max_payload_bytes)',
                    to_char(v_bytes, 'FM999,999,999,999'), to_char(v_limit, 'FM999,999,999,999'));
            -- A whole number of more than 4,300 digits (jsonb writes 1e5000 out in digits) is
            -- one Python's json cannot read (sys.get_int_max_str_digits): its text needs more
            -- than 4,300 bytes, so a smaller payload is not searched. A number with a decimal
            -- point is read as a float, whatever its size.
            ELSIF v_bytes > 4300 THEN
                SELECT length(ltrim(n::text, '-')) INTO v_digits
                FROM jsonb_path_query(v_payload, 'strict $.** ? (@.type() == "number" && '
                                                 '(@ >= 1e4300 || @ <= -1e4300))') AS n
                WHERE strpos(n::text, '.') = 0
                LIMIT 1;
                IF v_digits IS NOT NULL THEN
                    v_field := 'payload';
                    v_problem := format(
                        'must not hold a whole number of more than 4300 digits (Python cannot '
                        'read it back; send it as a string), got one of %s digits', v_digits);
                END IF;
            END IF;
        END IF;
    END IF;
    IF v_field IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = v_field || ': ' || v_problem,
            COLUMN = v_field;
    END IF;

    v_run_at := coalesce(enqueue.run_at,
                         now() + make_interval(secs => coalesce(v_seconds, 0)::float8));
    IF enqueue.unique_key IS NOT NULL THEN
        -- The bucket: the start of the period the transaction's time falls in, or -infinity
        -- (one bucket) without a period. The unique index jobs_unique_idx decides.
        v_bucket := CASE WHEN v_period IS NULL THEN '-infinity'::timestamptz
                         ELSE to_timestamp(floor(extract(epoch FROM now())::float8 / v_period)
                                           * v_period) END;
        LOOP
            INSERT INTO {schema}.jobs AS j (type, queue, payload, priority, max_retries,
                                            correlation_id, run_at, version, concurrency_key,
                                            unique_key, unique_states, unique_bucket)
            VALUES (v_type, v_queue, v_payload, v_priority, enqueue.max_retries,
                    coalesce(enqueue.correlation_id, gen_random_uuid()::text), v_run_at,
                    v_version, enqueue.concurrency_key, enqueue.unique_key, v_mask, v_bucket)
            ON CONFLICT (queue, type, unique_key, unique_bucket)
                WHERE unique_key IS NOT NULL AND {schema}.unique_state_in(unique_states, status)
                DO NOTHING
            RETURNING j.id INTO v_id;
            IF v_id IS NOT NULL THEN
                RETURN QUERY SELECT v_id, true;
                RETURN;
            END IF;
            SELECT j.id, j.status INTO v_id, v_status
            FROM {schema}.jobs AS j
            WHERE j.queue = v_queue AND j.type = v_type AND j.unique_key = enqueue.unique_key
              AND j.unique_bucket = v_bucket AND j.unique_key IS NOT NULL
              AND {schema}.unique_state_in(j.unique_states, j.status);
            IF v_id IS NOT NULL AND NOT coalesce(enqueue.replace, false) THEN
                RETURN QUERY SELECT v_id, false;
                RETURN;
            ELSIF v_id IS NOT NULL THEN
                -- Debounce: the pending holder takes this payload, priority and run_at (a
                -- parked job, run_at infinity, keeps its run_at).
                UPDATE {schema}.jobs AS j
                SET payload = v_payload, priority = v_priority,
                    run_at = CASE WHEN j.run_at = 'infinity' THEN j.run_at ELSE v_run_at END,
                    updated_at = now()
                WHERE j.id = v_id AND j.status = 'pending'
                RETURNING j.id INTO v_id;
                IF v_id IS NOT NULL THEN
                    PERFORM pg_notify({jobs_channel}, v_queue);
                    RETURN QUERY SELECT v_id, false;
                    RETURN;
                END IF;
                IF v_status = 'running' THEN
                    RAISE EXCEPTION USING ERRCODE = 'PGW03',
                        MESSAGE = format('unique_key %s is held by job %s, which is running: '
                                         'replace only changes a pending job; nothing was '
                                         'changed', quote_literal(enqueue.unique_key), v_id),
                        COLUMN = 'replace';
                END IF;
            END IF;
            -- The holder left its states in between (it ended, or started): try again.
            v_tries := v_tries + 1;
            IF v_tries >= 10 THEN
                RAISE EXCEPTION USING ERRCODE = '40001',
                    MESSAGE = format('unique_key %s: the job holding it kept changing during '
                                     'the enqueue; try again', quote_literal(enqueue.unique_key));
            END IF;
        END LOOP;
    END IF;
    IF v_key IS NOT NULL THEN
        v_fp := {schema}.fingerprint(v_type, v_payload);
    END IF;
    LOOP
        INSERT INTO {schema}.jobs AS j (type, queue, payload, priority, max_retries,
                                        idempotency_key, fingerprint, correlation_id, run_at,
                                        version, concurrency_key)
        VALUES (v_type, v_queue, v_payload, v_priority, enqueue.max_retries, v_key, v_fp,
                coalesce(enqueue.correlation_id, gen_random_uuid()::text), v_run_at, v_version,
                enqueue.concurrency_key)
        ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING j.id INTO v_id;
        IF v_id IS NOT NULL THEN
            RETURN QUERY SELECT v_id, true;
            RETURN;
        END IF;
        -- The key is taken: by a job of the same type and payload (returned), or not (refused).
        -- Queue, priority, schedule and concurrency key are not the work: the job is returned.
        SELECT j.id, {schema}.same_work(j.type, j.payload, v_type, v_payload)
            INTO v_id, v_matches
        FROM {schema}.jobs AS j WHERE j.idempotency_key = v_key;
        IF v_id IS NOT NULL THEN
            IF NOT v_matches THEN
                RAISE EXCEPTION USING ERRCODE = 'PGW01',
                    MESSAGE = format('idempotency_key %s already belongs to job %s with a '
                                     'different type or payload; use a new key for different '
                                     'work', quote_literal(v_key), v_id),
                    COLUMN = 'idempotency_key';
            END IF;
            RETURN QUERY SELECT v_id, false;
            RETURN;
        END IF;
        -- The job holding the key was deleted (pruned) in between: insert again.
    END LOOP;
END
$$;
COMMENT ON FUNCTION {schema}.enqueue(text, jsonb, text, anycompatible, bigint, text, text,
                                     timestamptz, interval, bigint, text, text, text[], interval,
                                     boolean) IS
    'Enqueue a job as pgworker.enqueue does (README: Enqueue from SQL). A NULL or JSON null '
    'payload is {}. The same idempotency key with the same type and JSON value (1 = 1.0) '
    'returns the job with created = false; with another, SQLSTATE PGW01. A refused argument: '
    'SQLSTATE 22023; a pgworker.max_payload_bytes that is not a number of bytes: PGW02. With a '
    'unique_key held by a live job, that job with created = false (replace: its payload, '
    'priority and run_at changed; PGW03 while it runs).';

-- The old function's grants, given to the new one. None recorded (NULL) are the default
-- privileges, EXECUTE for PUBLIC, which the new function has already.
DO $$
DECLARE
    v_acl  aclitem[] := nullif(current_setting('pgworker.enqueue_acl'), '')::aclitem[];
    v_fn   regprocedure := '{schema}.enqueue(text, jsonb, text, anycompatible, bigint, text, '
                           'text, timestamptz, interval, bigint, text, text, text[], '
                           'interval, boolean)';
    v_item record;
BEGIN
    IF v_acl IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_fn);
    FOR v_item IN
        SELECT grantee, is_grantable FROM aclexplode(v_acl) WHERE privilege_type = 'EXECUTE'
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', v_fn,
                       CASE WHEN v_item.grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_get_userbyid(v_item.grantee)) END,
                       CASE WHEN v_item.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;
