-- The pgworker schema as the migrations of sql/migrations make it: `pg_dump --schema-only
-- --schema=pgworker --no-owner` of a database migrated from scratch, by the pg_dump of the
-- server's major (PostgreSQL 15). A file to read, not to run: `pgworker migrate` applies the
-- migrations. Regenerate it with `make schema` (python -m tests.schema_dump > sql/schema.sql);
-- tests/test_schema_file.py fails when it differs from what the migrations make.
--
-- Left out of pg_dump's text, as they vary between runs and versions: its header comments (the
-- versions dumped from and by), the \restrict and \unrestrict lines of newer pg_dumps, the SET
-- and set_config lines that prepare a restore, and runs of blank lines.

--
-- PostgreSQL database dump
--

--
-- Name: pgworker; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA pgworker;

--
-- Name: emit(text, jsonb); Type: FUNCTION; Schema: pgworker; Owner: -
--

CREATE FUNCTION pgworker.emit(name text, data jsonb DEFAULT NULL::jsonb) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_event bigint;
    v_woken integer;
    v_queues integer;
    v_problem text;
BEGIN
    IF emit.name IS NULL OR emit.name = '' THEN
        v_problem := format('must be a non-empty string, got %s',
                            coalesce(quote_literal(emit.name), 'NULL'));
    ELSIF length(emit.name) > 200 THEN
        v_problem := format('must be at most 200 characters, got %s characters',
                            length(emit.name));
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'name: ' || v_problem,
            COLUMN = 'name';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('pgworker' || ':event:' || emit.name, 0));
    -- emitted_at is the time of this statement, not of the transaction: a wait takes the
    -- events emitted since its job was enqueued (jobs.created_at), and an emit in a transaction
    -- begun before the enqueue, run after it, is one of them.
    INSERT INTO "pgworker".events (name, data, emitted_at)
    VALUES (emit.name, emit.data, clock_timestamp())
    RETURNING id INTO v_event;
    WITH delivered AS (
        UPDATE "pgworker".job_event_waits AS w
        SET event_id = v_event, data = emit.data, delivered_at = clock_timestamp()
        FROM "pgworker".jobs AS j
        WHERE w.name = emit.name AND w.event_id IS NULL AND NOT w.timed_out
          AND j.id = w.job_id AND j.status IN ('pending', 'running')
        RETURNING w.job_id
    ), woken AS (
        UPDATE "pgworker".jobs AS j
        SET woken_at = clock_timestamp(),
            run_at = CASE WHEN j.status = 'pending' THEN least(j.run_at, now()) ELSE j.run_at END,
            updated_at = now()
        WHERE j.id IN (SELECT job_id FROM delivered) AND j.status IN ('pending', 'running')
        RETURNING j.queue
    ), notified AS (
        SELECT pg_notify('pgworker_jobs', q.queue) FROM (SELECT DISTINCT queue FROM woken) AS q
    )
    SELECT (SELECT count(*) FROM woken), (SELECT count(*) FROM notified) INTO v_woken, v_queues;
    RETURN v_woken;
END
$$;

--
-- Name: FUNCTION emit(name text, data jsonb); Type: COMMENT; Schema: pgworker; Owner: -
--

COMMENT ON FUNCTION pgworker.emit(name text, data jsonb) IS 'Emit an event as pgworker.emit does (docs/guide/events.md): delivered to every job waiting for it in ctx.wait_for_event, kept for later waits; returns the number of jobs woken. A refused name: SQLSTATE 22023.';

--
-- Name: enqueue(text, jsonb, text, anycompatible, bigint, text, text, timestamp with time zone, interval, bigint, text, text, text[], interval, boolean); Type: FUNCTION; Schema: pgworker; Owner: -
--

CREATE FUNCTION pgworker.enqueue(type text, payload jsonb DEFAULT '{}'::jsonb, queue text DEFAULT 'default'::text, priority anycompatible DEFAULT 0, max_retries bigint DEFAULT NULL::bigint, idempotency_key text DEFAULT NULL::text, correlation_id text DEFAULT NULL::text, run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, delay interval DEFAULT NULL::interval, version bigint DEFAULT 1, concurrency_key text DEFAULT NULL::text, unique_key text DEFAULT NULL::text, unique_states text[] DEFAULT NULL::text[], unique_period interval DEFAULT NULL::interval, replace boolean DEFAULT false) RETURNS TABLE(id bigint, created boolean)
    LANGUAGE plpgsql
    AS $_$
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
            INSERT INTO "pgworker".jobs AS j (type, queue, payload, priority, max_retries,
                                            correlation_id, run_at, version, concurrency_key,
                                            unique_key, unique_states, unique_bucket)
            VALUES (v_type, v_queue, v_payload, v_priority, enqueue.max_retries,
                    coalesce(enqueue.correlation_id, gen_random_uuid()::text), v_run_at,
                    v_version, enqueue.concurrency_key, enqueue.unique_key, v_mask, v_bucket)
            ON CONFLICT (queue, type, unique_key, unique_bucket)
                WHERE unique_key IS NOT NULL AND "pgworker".unique_state_in(unique_states, status)
                DO NOTHING
            RETURNING j.id INTO v_id;
            IF v_id IS NOT NULL THEN
                RETURN QUERY SELECT v_id, true;
                RETURN;
            END IF;
            SELECT j.id, j.status INTO v_id, v_status
            FROM "pgworker".jobs AS j
            WHERE j.queue = v_queue AND j.type = v_type AND j.unique_key = enqueue.unique_key
              AND j.unique_bucket = v_bucket AND j.unique_key IS NOT NULL
              AND "pgworker".unique_state_in(j.unique_states, j.status);
            IF v_id IS NOT NULL AND NOT coalesce(enqueue.replace, false) THEN
                RETURN QUERY SELECT v_id, false;
                RETURN;
            ELSIF v_id IS NOT NULL THEN
                -- Debounce: the pending holder takes this payload, priority and run_at (a
                -- parked job, run_at infinity, keeps its run_at).
                UPDATE "pgworker".jobs AS j
                SET payload = v_payload, priority = v_priority,
                    run_at = CASE WHEN j.run_at = 'infinity' THEN j.run_at ELSE v_run_at END,
                    updated_at = now()
                WHERE j.id = v_id AND j.status = 'pending'
                RETURNING j.id INTO v_id;
                IF v_id IS NOT NULL THEN
                    PERFORM pg_notify('pgworker_jobs', v_queue);
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
        v_fp := "pgworker".fingerprint(v_type, v_payload);
    END IF;
    LOOP
        INSERT INTO "pgworker".jobs AS j (type, queue, payload, priority, max_retries,
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
        SELECT j.id, "pgworker".same_work(j.type, j.payload, v_type, v_payload)
            INTO v_id, v_matches
        FROM "pgworker".jobs AS j WHERE j.idempotency_key = v_key;
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
$_$;

--
-- Name: FUNCTION enqueue(type text, payload jsonb, queue text, priority anycompatible, max_retries bigint, idempotency_key text, correlation_id text, run_at timestamp with time zone, delay interval, version bigint, concurrency_key text, unique_key text, unique_states text[], unique_period interval, replace boolean); Type: COMMENT; Schema: pgworker; Owner: -
--

COMMENT ON FUNCTION pgworker.enqueue(type text, payload jsonb, queue text, priority anycompatible, max_retries bigint, idempotency_key text, correlation_id text, run_at timestamp with time zone, delay interval, version bigint, concurrency_key text, unique_key text, unique_states text[], unique_period interval, replace boolean) IS 'Enqueue a job as pgworker.enqueue does (README: Enqueue from SQL). A NULL or JSON null payload is {}. The same idempotency key with the same type and JSON value (1 = 1.0) returns the job with created = false; with another, SQLSTATE PGW01. A refused argument: SQLSTATE 22023; a pgworker.max_payload_bytes that is not a number of bytes: PGW02. With a unique_key held by a live job, that job with created = false (replace: its payload, priority and run_at changed; PGW03 while it runs).';

--
-- Name: error_frame(text); Type: FUNCTION; Schema: pgworker; Owner: -
--

CREATE FUNCTION pgworker.error_frame(detail text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
DECLARE
    -- From the last `File "` on, found from the end: no scan of the whole traceback.
    line text := substr(detail, length(detail) - strpos(reverse(detail), '" eliF') - 4);
BEGIN
    -- String functions rather than a regular expression, and PL/pgSQL rather than a SQL
    -- function that cannot be inlined (its text is read four times): measured, about 3 us a
    -- traceback against 50.
    IF line LIKE 'File "%", line %, in %' THEN
        RETURN reverse(split_part(reverse(translate(split_part(substr(line, 7), '"', 1), '\',
                                                    '/')), '/', 1))
               || ':' || btrim(split_part(split_part(line, ', in ', 2), E'\n', 1));
    END IF;
    RETURN NULL;
END
$$;

--
-- Name: error_group(text, text, text, text); Type: FUNCTION; Schema: pgworker; Owner: -
--

CREATE FUNCTION pgworker.error_group(job_type text, error_class text, message text, detail text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN error_class IS NOT NULL THEN
        left(md5(concat(coalesce(job_type, ''), E'\x1f', error_class, E'\x1f',
                        "pgworker".error_shape(message), E'\x1f',
                        coalesce("pgworker".error_frame(detail), ''))), 16)
    END
$$;

--
-- Name: error_shape(text); Type: FUNCTION; Schema: pgworker; Owner: -
--

CREATE FUNCTION pgworker.error_shape(message text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $_$
    SELECT left(btrim(regexp_replace(
        regexp_replace(
        regexp_replace(
        regexp_replace(
        regexp_replace(
        regexp_replace(
        regexp_replace(
        regexp_replace(
        regexp_replace(
        regexp_replace(
            coalesce(message, ''),
            $r$(^|[^[:alnum:]_])'[^']*'$r$, '\1''?''', 'g'),
            $r$(^|[^[:alnum:]_])"[^"]*"$r$, '\1"?"', 'g'),
            $r$[[:alpha:]][[:alnum:]+.-]*://[^[:space:]'"<>]+$r$, '<url>', 'g'),
            $r$[^[:space:]'"<>@(),;:]+@[[:alnum:]-]+(\.[[:alnum:]-]+)+$r$, '<email>', 'g'),
            $r$(^|[[:space:](=,'"])(~|\.{1,2})?(/[^[:space:]/'"(),;:]+){2,}/?$r$, '\1<path>',
            'g'),
            $r$(^|[^[:alnum:]_])[[:alpha:]]:\\[^[:space:]'"]*$r$, '\1<path>', 'g'),
            $r$[[:xdigit:]]{8}-[[:xdigit:]]{4}-[[:xdigit:]]{4}-[[:xdigit:]]{4}-[[:xdigit:]]{12}$r$,
            '<uuid>', 'g'),
            $r$(^|[^[:alnum:]_])0[xX][[:xdigit:]]+$r$, '\1<hex>', 'g'),
            -- A word holding a digit, with its dots and hyphens: a number (404, 30.5, 10.0.0.1)
            -- or an id (ord_8f3a2, web-3-12345-a1b2c3, utf-8).
            $r$(^|[^[:alnum:]_.<>-])[[:alnum:]_.-]*[0-9][[:alnum:]_.-]*$r$, '\1<n>', 'g'),
        '[[:space:]]+', ' ', 'g')), 500)
$_$;

--
-- Name: fingerprint(text, jsonb); Type: FUNCTION; Schema: pgworker; Owner: -
--

CREATE FUNCTION pgworker.fingerprint(type text, payload jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $_$ SELECT md5($1 || chr(31) || $2::text) $_$;

--
-- Name: FUNCTION fingerprint(type text, payload jsonb); Type: COMMENT; Schema: pgworker; Owner: -
--

COMMENT ON FUNCTION pgworker.fingerprint(type text, payload jsonb) IS 'Written with an idempotency key for enqueuers of versions before migration 10; idempotency compares with same_work(), not with this text hash.';

--
-- Name: jobs_notification(text, bigint, bigint, text, text, integer); Type: FUNCTION; Schema: pgworker; Owner: -
--

CREATE FUNCTION pgworker.jobs_notification(queue text, first_id bigint, n bigint, first_type text, last_type text, hops integer DEFAULT NULL::integer) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN hops IS NULL
                THEN json_build_object(
                    'queue', queue, 'id', first_id, 'count', n,
                    'types', CASE WHEN first_type = last_type
                                  THEN json_build_array(first_type) END)
                ELSE json_build_object(
                    'queue', queue, 'id', first_id, 'count', n,
                    'types', CASE WHEN first_type = last_type
                                  THEN json_build_array(first_type) END,
                    'hops', hops)
           END::text
$$;

--
-- Name: notify_job_ended(); Type: FUNCTION; Schema: pgworker; Owner: -
--

CREATE FUNCTION pgworker.notify_job_ended() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('pgworker_ended', NEW.id::text);
    RETURN NULL;
END
$$;

--
-- Name: notify_jobs(); Type: FUNCTION; Schema: pgworker; Owner: -
--

CREATE FUNCTION pgworker.notify_jobs() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('pgworker_jobs',
                      "pgworker".jobs_notification(q.queue, q.first_id, q.n, q.first_type,
                                                 q.last_type))
    FROM (SELECT queue, min(id) AS first_id, count(*) AS n,
                 min(type COLLATE "C") AS first_type, max(type COLLATE "C") AS last_type
          FROM new_jobs WHERE status = 'pending' GROUP BY queue) AS q;
    RETURN NULL;
END
$$;

--
-- Name: release_dependants(); Type: FUNCTION; Schema: pgworker; Owner: -
--

CREATE FUNCTION pgworker.release_dependants() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_failed boolean := NEW.status IN ('failed', 'cancelled');
    v_woken  bigint;
BEGIN
    WITH children AS (
        SELECT c.id
        FROM "pgworker".job_dependencies AS d
        JOIN "pgworker".jobs AS c ON c.id = d.child_id
        WHERE d.parent_id = NEW.id AND c.status = 'pending' AND c.run_at = 'infinity'
          AND c.parents_left > 0
        ORDER BY c.id
        FOR UPDATE OF c
    ), released AS (
        UPDATE "pgworker".jobs AS c
        SET status = CASE WHEN v_failed AND c.on_parent_failure = 'cancel' THEN 'cancelled'
                          ELSE 'pending' END,
            finished_at = CASE WHEN v_failed AND c.on_parent_failure = 'cancel' THEN now() END,
            error = CASE WHEN v_failed AND c.on_parent_failure = 'cancel'
                         THEN format('ParentFailed: parent %s %s', NEW.id, NEW.status)
                         ELSE c.error END,
            parents_left = CASE WHEN v_failed AND c.on_parent_failure = 'cancel'
                                THEN c.parents_left ELSE c.parents_left - 1 END,
            run_at = CASE WHEN NOT (v_failed AND c.on_parent_failure = 'cancel')
                               AND c.parents_left = 1
                          THEN now() ELSE c.run_at END,
            updated_at = now()
        WHERE c.id = ANY(ARRAY(SELECT id FROM children))
        RETURNING c.id, c.queue, c.type, c.status, c.parents_left
    )
    -- The workers of the released jobs' queues are woken as by an enqueue (see notify_jobs).
    SELECT count(pg_notify('pgworker_jobs',
                           "pgworker".jobs_notification(q.queue, q.first_id, q.n, q.first_type,
                                                      q.last_type)))
    INTO v_woken
    FROM (SELECT queue, min(id) AS first_id, count(*) AS n,
                 min(type COLLATE "C") AS first_type, max(type COLLATE "C") AS last_type
          FROM released WHERE status = 'pending' AND parents_left = 0
          GROUP BY queue) AS q;
    RETURN NULL;
END
$$;

--
-- Name: repark_dependants(); Type: FUNCTION; Schema: pgworker; Owner: -
--

CREATE FUNCTION pgworker.repark_dependants() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    WITH children AS (
        SELECT c.id
        FROM "pgworker".job_dependencies AS d
        JOIN "pgworker".jobs AS c ON c.id = d.child_id
        WHERE d.parent_id = NEW.id AND c.status = 'pending' AND c.attempts = 0
          AND c.parents IS NOT NULL
        ORDER BY c.id
        FOR UPDATE OF c
    )
    UPDATE "pgworker".jobs AS c
    SET parents_left = c.parents_left + 1, run_at = 'infinity', updated_at = now()
    WHERE c.id = ANY(ARRAY(SELECT id FROM children));
    RETURN NULL;
END
$$;

--
-- Name: same_work(text, jsonb, text, jsonb); Type: FUNCTION; Schema: pgworker; Owner: -
--

CREATE FUNCTION pgworker.same_work(job_type text, job_payload jsonb, type text, payload jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $_$ SELECT $1 = $3 AND coalesce(nullif($2, 'null'), '{}') = $4 $_$;

--
-- Name: unique_state_in(smallint, text); Type: FUNCTION; Schema: pgworker; Owner: -
--

CREATE FUNCTION pgworker.unique_state_in(mask smallint, status text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT mask & CASE status WHEN 'pending' THEN 1 WHEN 'running' THEN 2 WHEN 'completed' THEN 4
                              WHEN 'failed' THEN 8 WHEN 'cancelled' THEN 16 ELSE 0 END <> 0
$$;

--
-- Name: bulk_actions; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.bulk_actions (
    id bigint NOT NULL,
    kind text NOT NULL,
    filter jsonb NOT NULL,
    run_at timestamp with time zone,
    max_id bigint NOT NULL,
    matched bigint NOT NULL,
    done bigint DEFAULT 0 NOT NULL,
    skipped bigint DEFAULT 0 NOT NULL,
    cursor bigint DEFAULT 0 NOT NULL,
    state text DEFAULT 'running'::text NOT NULL,
    error text,
    actor text NOT NULL,
    reason text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    runner text,
    runner_kind text,
    runner_since timestamp with time zone,
    lease_until timestamp with time zone,
    CONSTRAINT bulk_actions_check CHECK (((kind = 'reschedule'::text) = (run_at IS NOT NULL))),
    CONSTRAINT bulk_actions_done_check CHECK ((done >= 0)),
    CONSTRAINT bulk_actions_kind_check CHECK ((kind = ANY (ARRAY['replay'::text, 'cancel'::text, 'delete'::text, 'reschedule'::text]))),
    CONSTRAINT bulk_actions_matched_check CHECK ((matched >= 0)),
    CONSTRAINT bulk_actions_runner_kind_check CHECK ((runner_kind = ANY (ARRAY['console'::text, 'serve'::text, 'worker'::text, 'cli'::text]))),
    CONSTRAINT bulk_actions_skipped_check CHECK ((skipped >= 0)),
    CONSTRAINT bulk_actions_state_check CHECK ((state = ANY (ARRAY['running'::text, 'done'::text, 'failed'::text])))
);

--
-- Name: bulk_actions_id_seq; Type: SEQUENCE; Schema: pgworker; Owner: -
--

ALTER TABLE pgworker.bulk_actions ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgworker.bulk_actions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: events; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.events (
    id bigint NOT NULL,
    name text NOT NULL,
    data jsonb,
    emitted_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT events_name_check CHECK (((name <> ''::text) AND (length(name) <= 200)))
);

--
-- Name: events_id_seq; Type: SEQUENCE; Schema: pgworker; Owner: -
--

ALTER TABLE pgworker.events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgworker.events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: job_attempts; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.job_attempts (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    type text NOT NULL,
    queue text NOT NULL,
    worker_id text NOT NULL,
    correlation_id text NOT NULL,
    outcome text DEFAULT 'running'::text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    error_type text,
    error_message text,
    code_version text,
    error_detail text,
    run_ms real,
    wait_ms real,
    error_group text,
    CONSTRAINT job_attempts_attempt_check CHECK ((attempt >= 1)),
    CONSTRAINT job_attempts_outcome_check CHECK ((outcome = ANY (ARRAY['running'::text, 'completed'::text, 'retried'::text, 'failed'::text, 'timed_out'::text, 'interrupted'::text, 'cancelled'::text, 'lost'::text, 'snoozed'::text, 'waiting'::text])))
)
WITH (fillfactor='80');

--
-- Name: job_attempts_id_seq; Type: SEQUENCE; Schema: pgworker; Owner: -
--

ALTER TABLE pgworker.job_attempts ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgworker.job_attempts_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: job_dependencies; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.job_dependencies (
    parent_id bigint NOT NULL,
    child_id bigint NOT NULL
);

--
-- Name: job_event_waits; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.job_event_waits (
    job_id bigint NOT NULL,
    seq integer NOT NULL,
    name text NOT NULL,
    deadline timestamp with time zone,
    event_id bigint,
    data jsonb,
    timed_out boolean DEFAULT false NOT NULL,
    attempt integer NOT NULL,
    waited_at timestamp with time zone DEFAULT now() NOT NULL,
    delivered_at timestamp with time zone,
    CONSTRAINT job_event_waits_seq_check CHECK ((seq >= 1))
);

--
-- Name: job_events; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.job_events (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    kind text NOT NULL,
    actor text,
    reason text,
    at timestamp with time zone DEFAULT now() NOT NULL,
    detail jsonb
);

--
-- Name: job_events_id_seq; Type: SEQUENCE; Schema: pgworker; Owner: -
--

ALTER TABLE pgworker.job_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgworker.job_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: job_milestones; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.job_milestones (
    job_id bigint NOT NULL,
    seq bigint NOT NULL,
    attempt integer NOT NULL,
    milestone text NOT NULL,
    detail jsonb,
    at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: job_milestones_seq_seq; Type: SEQUENCE; Schema: pgworker; Owner: -
--

ALTER TABLE pgworker.job_milestones ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgworker.job_milestones_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: job_steps; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.job_steps (
    job_id bigint NOT NULL,
    name text NOT NULL,
    result jsonb,
    attempt integer NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT job_steps_attempt_check CHECK ((attempt >= 1)),
    CONSTRAINT job_steps_name_check CHECK ((name <> ''::text))
);

--
-- Name: jobs; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.jobs (
    id bigint NOT NULL,
    type text NOT NULL,
    queue text DEFAULT 'default'::text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    retry_count integer DEFAULT 0 NOT NULL,
    max_retries integer,
    attempts integer DEFAULT 0 NOT NULL,
    idempotency_key text,
    fingerprint text,
    correlation_id text DEFAULT (gen_random_uuid())::text NOT NULL,
    run_at timestamp with time zone DEFAULT now() NOT NULL,
    claimed_at timestamp with time zone,
    worker_id text,
    lease_expires_at timestamp with time zone,
    heartbeat_at timestamp with time zone,
    error text,
    progress jsonb,
    result jsonb,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    cancel_requested_at timestamp with time zone,
    version integer DEFAULT 1 NOT NULL,
    budget_started_at timestamp with time zone,
    traceparent text,
    scheduled_at timestamp with time zone,
    concurrency_key text,
    unique_key text,
    unique_states smallint,
    unique_bucket timestamp with time zone,
    awaited boolean DEFAULT false NOT NULL,
    parents bigint[],
    parents_left integer,
    on_parent_failure text,
    has_dependants boolean DEFAULT false NOT NULL,
    woken_at timestamp with time zone,
    error_group text,
    CONSTRAINT jobs_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT jobs_concurrency_key_check CHECK (((char_length(concurrency_key) >= 1) AND (char_length(concurrency_key) <= 200))),
    CONSTRAINT jobs_max_retries_check CHECK ((max_retries >= 0)),
    CONSTRAINT jobs_on_parent_failure_check CHECK ((on_parent_failure = ANY (ARRAY['cancel'::text, 'run'::text]))),
    CONSTRAINT jobs_parents_left_check CHECK ((parents_left >= 0)),
    CONSTRAINT jobs_queue_check CHECK ((queue <> ''::text)),
    CONSTRAINT jobs_retry_count_check CHECK ((retry_count >= 0)),
    CONSTRAINT jobs_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text, 'completed'::text, 'failed'::text, 'cancelled'::text]))),
    CONSTRAINT jobs_type_check CHECK ((type <> ''::text)),
    CONSTRAINT jobs_unique_key_check CHECK (((char_length(unique_key) >= 1) AND (char_length(unique_key) <= 200))),
    CONSTRAINT jobs_unique_states_check CHECK ((((unique_states)::integer & 3) = 3)),
    CONSTRAINT jobs_unique_whole CHECK ((((unique_key IS NULL) = (unique_states IS NULL)) AND ((unique_key IS NULL) = (unique_bucket IS NULL)))),
    CONSTRAINT jobs_version_check CHECK ((version >= 1))
)
WITH (fillfactor='80');

--
-- Name: jobs_id_seq; Type: SEQUENCE; Schema: pgworker; Owner: -
--

ALTER TABLE pgworker.jobs ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgworker.jobs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: key_cursors; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.key_cursors (
    queue text NOT NULL,
    type text NOT NULL,
    last_key text NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: leader; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.leader (
    name text NOT NULL,
    worker_id text NOT NULL,
    elected_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL
);

--
-- Name: migrations; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: operator_log; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.operator_log (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    actor text NOT NULL,
    action text NOT NULL,
    queue text,
    reason text,
    detail jsonb
);

--
-- Name: operator_log_id_seq; Type: SEQUENCE; Schema: pgworker; Owner: -
--

ALTER TABLE pgworker.operator_log ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgworker.operator_log_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: overdue_jobs; Type: VIEW; Schema: pgworker; Owner: -
--

CREATE VIEW pgworker.overdue_jobs AS
 SELECT j.id,
    j.type,
    j.queue,
    j.worker_id,
    j.attempts,
    j.lease_expires_at,
    j.heartbeat_at,
    (now() - j.lease_expires_at) AS overdue_by
   FROM pgworker.jobs j
  WHERE ((j.lease_expires_at IS NOT NULL) AND (j.lease_expires_at < now()) AND (j.status = 'running'::text))
  ORDER BY j.lease_expires_at, j.id;

--
-- Name: periodic; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.periodic (
    name text NOT NULL,
    type text NOT NULL,
    schedule text NOT NULL,
    next_slot timestamp with time zone NOT NULL,
    last_slot timestamp with time zone,
    last_key text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    checked_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: queue_backlog; Type: VIEW; Schema: pgworker; Owner: -
--

CREATE VIEW pgworker.queue_backlog AS
 SELECT j.queue,
    count(*) AS pending_due,
    min(j.run_at) AS oldest_run_at,
    (now() - min(j.run_at)) AS oldest_age
   FROM pgworker.jobs j
  WHERE ((j.status = 'pending'::text) AND (j.run_at <= now()))
  GROUP BY j.queue;

--
-- Name: queues; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.queues (
    name text NOT NULL,
    paused_at timestamp with time zone,
    paused_by text,
    pause_reason text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    max_running integer,
    rate_limit integer,
    rate_period integer,
    CONSTRAINT queues_max_running_check CHECK ((max_running >= 1)),
    CONSTRAINT queues_rate_limit_check CHECK (((rate_limit >= 1) AND (rate_limit <= 10000))),
    CONSTRAINT queues_rate_period_check CHECK (((rate_period >= 1) AND (rate_period <= 86400))),
    CONSTRAINT queues_rate_whole CHECK (((rate_limit IS NULL) = (rate_period IS NULL)))
);

--
-- Name: rate_windows; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.rate_windows (
    name text NOT NULL,
    starts timestamp with time zone[] DEFAULT '{}'::timestamp with time zone[] NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: recent_failures; Type: VIEW; Schema: pgworker; Owner: -
--

CREATE VIEW pgworker.recent_failures AS
 SELECT j.id,
    j.type,
    j.queue,
    j.correlation_id,
    j.attempts,
    j.error,
    j.finished_at
   FROM pgworker.jobs j
  WHERE ((j.finished_at IS NOT NULL) AND (j.status = 'failed'::text))
  ORDER BY j.finished_at DESC, j.id DESC
 LIMIT 100;

--
-- Name: stats_minutes; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.stats_minutes (
    queue text NOT NULL,
    type text NOT NULL,
    minute timestamp with time zone NOT NULL,
    enqueued integer NOT NULL,
    completed integer NOT NULL,
    failed integer NOT NULL,
    wait_min double precision,
    wait_max double precision,
    run_min double precision,
    run_max double precision,
    wait_buckets smallint[] NOT NULL,
    wait_counts integer[] NOT NULL,
    run_buckets smallint[] NOT NULL,
    run_counts integer[] NOT NULL
);

--
-- Name: stats_rollup; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.stats_rollup (
    minute timestamp with time zone NOT NULL,
    rolled_at timestamp with time zone NOT NULL,
    running integer NOT NULL
);

--
-- Name: type_stats; Type: VIEW; Schema: pgworker; Owner: -
--

CREATE VIEW pgworker.type_stats AS
 SELECT a.type,
    count(*) AS attempts,
    count(*) FILTER (WHERE (a.outcome = 'running'::text)) AS running,
    count(*) FILTER (WHERE (a.outcome = 'completed'::text)) AS completed,
    count(*) FILTER (WHERE (a.outcome = 'failed'::text)) AS failed,
    count(*) FILTER (WHERE (a.outcome = 'timed_out'::text)) AS timed_out,
    count(*) FILTER (WHERE (a.outcome = 'retried'::text)) AS retried,
    ((count(*) FILTER (WHERE (a.outcome = ANY (ARRAY['failed'::text, 'timed_out'::text, 'retried'::text]))))::double precision / (NULLIF(count(*) FILTER (WHERE (a.outcome <> 'running'::text)), 0))::double precision) AS failure_rate,
    percentile_cont((0.5)::double precision) WITHIN GROUP (ORDER BY ((EXTRACT(epoch FROM (a.finished_at - a.started_at)))::double precision)) FILTER (WHERE (a.finished_at IS NOT NULL)) AS p50_seconds,
    percentile_cont((0.95)::double precision) WITHIN GROUP (ORDER BY ((EXTRACT(epoch FROM (a.finished_at - a.started_at)))::double precision)) FILTER (WHERE (a.finished_at IS NOT NULL)) AS p95_seconds
   FROM pgworker.job_attempts a
  WHERE (a.started_at > (now() - '01:00:00'::interval))
  GROUP BY a.type;

--
-- Name: workers; Type: TABLE; Schema: pgworker; Owner: -
--

CREATE TABLE pgworker.workers (
    worker_id text NOT NULL,
    hostname text NOT NULL,
    pid integer NOT NULL,
    queues text[] NOT NULL,
    types text[] NOT NULL,
    concurrency integer NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    lease double precision,
    http boolean DEFAULT false NOT NULL,
    functions text[],
    CONSTRAINT workers_lease_check CHECK ((lease > (0)::double precision))
);

--
-- Name: worker_activity; Type: VIEW; Schema: pgworker; Owner: -
--

CREATE VIEW pgworker.worker_activity AS
 SELECT w.worker_id,
    w.hostname,
    w.pid,
    w.queues,
    w.types,
    w.concurrency,
    w.started_at,
    w.last_seen_at,
    (now() - w.last_seen_at) AS seen_ago,
    COALESCE(r.job_ids, '{}'::bigint[]) AS running_job_ids
   FROM (pgworker.workers w
     LEFT JOIN ( SELECT j.worker_id,
            array_agg(j.id ORDER BY j.id) AS job_ids
           FROM pgworker.jobs j
          WHERE ((j.lease_expires_at IS NOT NULL) AND (j.status = 'running'::text))
          GROUP BY j.worker_id) r ON ((r.worker_id = w.worker_id)));

--
-- Name: bulk_actions bulk_actions_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.bulk_actions
    ADD CONSTRAINT bulk_actions_pkey PRIMARY KEY (id);

--
-- Name: events events_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (id);

--
-- Name: job_attempts job_attempts_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.job_attempts
    ADD CONSTRAINT job_attempts_pkey PRIMARY KEY (job_id, attempt);

--
-- Name: job_dependencies job_dependencies_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.job_dependencies
    ADD CONSTRAINT job_dependencies_pkey PRIMARY KEY (parent_id, child_id);

--
-- Name: job_event_waits job_event_waits_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.job_event_waits
    ADD CONSTRAINT job_event_waits_pkey PRIMARY KEY (job_id, seq);

--
-- Name: job_events job_events_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.job_events
    ADD CONSTRAINT job_events_pkey PRIMARY KEY (id);

--
-- Name: job_milestones job_milestones_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.job_milestones
    ADD CONSTRAINT job_milestones_pkey PRIMARY KEY (job_id, seq);

--
-- Name: job_steps job_steps_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.job_steps
    ADD CONSTRAINT job_steps_pkey PRIMARY KEY (job_id, name);

--
-- Name: jobs jobs_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);

--
-- Name: key_cursors key_cursors_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.key_cursors
    ADD CONSTRAINT key_cursors_pkey PRIMARY KEY (queue, type);

--
-- Name: leader leader_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.leader
    ADD CONSTRAINT leader_pkey PRIMARY KEY (name);

--
-- Name: migrations migrations_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.migrations
    ADD CONSTRAINT migrations_pkey PRIMARY KEY (version);

--
-- Name: operator_log operator_log_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.operator_log
    ADD CONSTRAINT operator_log_pkey PRIMARY KEY (id);

--
-- Name: periodic periodic_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.periodic
    ADD CONSTRAINT periodic_pkey PRIMARY KEY (name);

--
-- Name: queues queues_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.queues
    ADD CONSTRAINT queues_pkey PRIMARY KEY (name);

--
-- Name: rate_windows rate_windows_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.rate_windows
    ADD CONSTRAINT rate_windows_pkey PRIMARY KEY (name);

--
-- Name: stats_minutes stats_minutes_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.stats_minutes
    ADD CONSTRAINT stats_minutes_pkey PRIMARY KEY (queue, type, minute);

--
-- Name: stats_rollup stats_rollup_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.stats_rollup
    ADD CONSTRAINT stats_rollup_pkey PRIMARY KEY (minute);

--
-- Name: workers workers_pkey; Type: CONSTRAINT; Schema: pgworker; Owner: -
--

ALTER TABLE ONLY pgworker.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (worker_id);

--
-- Name: bulk_actions_running_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX bulk_actions_running_idx ON pgworker.bulk_actions USING btree (id) WHERE (state = 'running'::text);

--
-- Name: events_emitted_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX events_emitted_idx ON pgworker.events USING btree (emitted_at);

--
-- Name: events_name_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX events_name_idx ON pgworker.events USING btree (name, emitted_at, id);

--
-- Name: job_attempts_started_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX job_attempts_started_idx ON pgworker.job_attempts USING brin (started_at);

--
-- Name: job_attempts_type_started_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX job_attempts_type_started_idx ON pgworker.job_attempts USING btree (type, started_at);

--
-- Name: job_event_waits_open_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX job_event_waits_open_idx ON pgworker.job_event_waits USING btree (name) WHERE ((event_id IS NULL) AND (NOT timed_out));

--
-- Name: job_events_job_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX job_events_job_idx ON pgworker.job_events USING btree (job_id);

--
-- Name: job_events_operator_at_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX job_events_operator_at_idx ON pgworker.job_events USING btree (at, id) WHERE ((actor IS NOT NULL) AND (NOT COALESCE((detail ? 'bulk_action'::text), false)));

--
-- Name: jobs_claim_key_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX jobs_claim_key_idx ON pgworker.jobs USING btree (queue, type, version, concurrency_key, priority DESC, run_at, id) WHERE ((status = 'pending'::text) AND (concurrency_key IS NOT NULL));

--
-- Name: jobs_claim_type_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX jobs_claim_type_idx ON pgworker.jobs USING btree (queue, type, version, priority DESC, run_at, id) WHERE (status = 'pending'::text);

--
-- Name: jobs_created_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX jobs_created_idx ON pgworker.jobs USING brin (created_at);

--
-- Name: jobs_error_group_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX jobs_error_group_idx ON pgworker.jobs USING btree (error_group, id) WHERE (error_group IS NOT NULL);

--
-- Name: jobs_finished_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX jobs_finished_idx ON pgworker.jobs USING btree (finished_at) WHERE (finished_at IS NOT NULL);

--
-- Name: jobs_idempotency_key_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE UNIQUE INDEX jobs_idempotency_key_idx ON pgworker.jobs USING btree (idempotency_key) WHERE (idempotency_key IS NOT NULL);

--
-- Name: jobs_lease_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX jobs_lease_idx ON pgworker.jobs USING btree (lease_expires_at) WHERE (lease_expires_at IS NOT NULL);

--
-- Name: jobs_needs_attention_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX jobs_needs_attention_idx ON pgworker.jobs USING btree (id) WHERE (status = ANY (ARRAY['failed'::text, 'cancelled'::text]));

--
-- Name: jobs_unique_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE UNIQUE INDEX jobs_unique_idx ON pgworker.jobs USING btree (queue, type, unique_key, unique_bucket) WHERE ((unique_key IS NOT NULL) AND pgworker.unique_state_in(unique_states, status));

--
-- Name: operator_log_at_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX operator_log_at_idx ON pgworker.operator_log USING btree (at, id);

--
-- Name: operator_log_queue_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX operator_log_queue_idx ON pgworker.operator_log USING btree (queue, at);

--
-- Name: stats_minutes_minute_idx; Type: INDEX; Schema: pgworker; Owner: -
--

CREATE INDEX stats_minutes_minute_idx ON pgworker.stats_minutes USING btree (minute);

--
-- Name: jobs jobs_ended_notify; Type: TRIGGER; Schema: pgworker; Owner: -
--

CREATE TRIGGER jobs_ended_notify AFTER UPDATE OF status ON pgworker.jobs FOR EACH ROW WHEN ((new.awaited AND (new.status = ANY (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text])) AND (old.status IS DISTINCT FROM new.status))) EXECUTE FUNCTION pgworker.notify_job_ended();

--
-- Name: jobs jobs_notify; Type: TRIGGER; Schema: pgworker; Owner: -
--

CREATE TRIGGER jobs_notify AFTER INSERT ON pgworker.jobs REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION pgworker.notify_jobs();

--
-- Name: jobs jobs_release_dependants; Type: TRIGGER; Schema: pgworker; Owner: -
--

CREATE TRIGGER jobs_release_dependants AFTER UPDATE OF status ON pgworker.jobs FOR EACH ROW WHEN ((new.has_dependants AND (old.status <> new.status) AND (new.status = ANY (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text])))) EXECUTE FUNCTION pgworker.release_dependants();

--
-- Name: jobs jobs_repark_dependants; Type: TRIGGER; Schema: pgworker; Owner: -
--

CREATE TRIGGER jobs_repark_dependants AFTER UPDATE OF status ON pgworker.jobs FOR EACH ROW WHEN ((new.has_dependants AND (new.status = 'pending'::text) AND (old.status = ANY (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text])))) EXECUTE FUNCTION pgworker.repark_dependants();

--
-- PostgreSQL database dump complete
--
