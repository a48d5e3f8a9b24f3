-- The SQL function takes a concurrency key (issue 23, item 3), as pgworker.enqueue does:
--     SELECT * FROM pgworker.enqueue('sync-account', '{"account": 42}',
--                                    concurrency_key => 'customer-42');
-- It is the last parameter, so that calls by position keep working. The old function is dropped,
-- not overloaded: two functions whose trailing parameters have defaults make calls that omit
-- them ambiguous. Its grants are given to the new one (a DROP loses them): a deployment that
-- revoked EXECUTE from PUBLIC and granted it to some roles keeps exactly that.
--
-- The key is checked as Python checks it (_limits.concurrency_key): a non-empty string of at
-- most 200 characters (text cannot hold NUL), refused with SQLSTATE 22023 naming
-- concurrency_key, after version and before the payload, in the order of enqueue._fields. With
-- an idempotency key already taken by the same work, the existing job is returned whatever
-- concurrency key it was enqueued with, as for queue and priority. The rest is migration 10's.
SELECT set_config('pgworker.enqueue_acl', coalesce(p.proacl::text, ''), true)
FROM pg_proc AS p
WHERE p.oid = '{schema}.enqueue(text, jsonb, text, anycompatible, bigint, text, text, '
              'timestamptz, interval, bigint)'::regprocedure;

DROP FUNCTION {schema}.enqueue(text, jsonb, text, anycompatible, bigint, text, text,
                               timestamptz, interval, bigint);

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
    concurrency_key text          DEFAULT NULL
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
                                     timestamptz, interval, bigint, text) IS
    'Enqueue a job as pgworker.enqueue does (README: Enqueue from SQL). A NULL or JSON null '
    'payload is {}. The same idempotency key with the same type and JSON value (1 = 1.0) '
    'returns the job with created = false; with another, SQLSTATE PGW01. A refused argument: '
    'SQLSTATE 22023; a pgworker.max_payload_bytes that is not a number of bytes: PGW02.';

-- The old function's grants, given to the new one. None recorded (NULL) are the default
-- privileges, EXECUTE for PUBLIC, which the new function has already.
DO $$
DECLARE
    v_acl  aclitem[] := nullif(current_setting('pgworker.enqueue_acl'), '')::aclitem[];
    v_fn   regprocedure := '{schema}.enqueue(text, jsonb, text, anycompatible, bigint, text, '
                           'text, timestamptz, interval, bigint, text)';
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
