-- Durable waits for an event (issue 24, item 4): `await ctx.wait_for_event(name, timeout=)` in a
-- handler, `pgworker.emit(conn, name, data)` / `SELECT pgworker.emit(name, data)` anywhere.
--
-- `events` keeps every event emitted (pruned with the finished jobs' retention). A job's k-th
-- wait is row (job_id, k) of `job_event_waits`, recorded under the attempt's fence; `event_id`
-- and `data` are set when an event is delivered to it (by emit, or taken by the wait itself from
-- the events emitted since the job was enqueued), `timed_out` when its deadline passed first.
-- A waiting attempt ends with the outcome `waiting`: the job goes back to `pending` with run_at
-- at the deadline, or 'infinity' without one (no claim reads it: run_at <= now()), and emit sets
-- it due again. `jobs.woken_at` (clock_timestamp() of the last emit that delivered to the job)
-- lets the waiting outcome see an emit that came while the attempt was still running.
--
-- Locks: new tables, a nullable column without default (catalog only) and a new value in the
-- outcome check (validated by a scan of job_attempts under its ACCESS EXCLUSIVE lock); the
-- claim and its index are unchanged.
CREATE TABLE {schema}.events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL CHECK (name <> '' AND length(name) <= 200),
    data       jsonb,
    emitted_at timestamptz NOT NULL DEFAULT now()
);
-- "Events of this name emitted after X", oldest first (a wait taking one).
CREATE INDEX events_name_idx ON {schema}.events (name, emitted_at, id);
-- Retention, oldest first.
CREATE INDEX events_emitted_idx ON {schema}.events (emitted_at);

CREATE TABLE {schema}.job_event_waits (
    job_id       bigint      NOT NULL,
    seq          integer     NOT NULL CHECK (seq >= 1),
    name         text        NOT NULL,
    deadline     timestamptz,
    event_id     bigint,
    data         jsonb,
    timed_out    boolean     NOT NULL DEFAULT false,
    attempt      integer     NOT NULL,
    waited_at    timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    PRIMARY KEY (job_id, seq)
);
-- "Waits of this name not yet delivered" (emit).
CREATE INDEX job_event_waits_open_idx ON {schema}.job_event_waits (name)
    WHERE event_id IS NULL AND NOT timed_out;

ALTER TABLE {schema}.jobs ADD COLUMN woken_at timestamptz;

ALTER TABLE {schema}.job_attempts DROP CONSTRAINT job_attempts_outcome_check;
ALTER TABLE {schema}.job_attempts ADD CONSTRAINT job_attempts_outcome_check
    CHECK (outcome IN ('running', 'completed', 'retried', 'failed', 'timed_out', 'interrupted',
                       'cancelled', 'lost', 'snoozed', 'waiting'));

-- Emit an event: store it, deliver it to every pending or running job waiting for `name`, make
-- those jobs due and notify their queues' workers; returns how many jobs it woke. In the
-- caller's transaction (READ COMMITTED: each statement reads what committed before it). Emits
-- and waits of one name take turns on a transaction-scoped advisory lock, so that a wait being
-- recorded and an event being emitted at once always meet: the later one reads the earlier.
CREATE FUNCTION {schema}.emit(name text, data jsonb DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE
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
    PERFORM pg_advisory_xact_lock(hashtextextended({schema_literal} || ':event:' || emit.name, 0));
    -- emitted_at is the time of this statement, not of the transaction: a wait takes the
    -- events emitted since its job was enqueued (jobs.created_at), and an emit in a transaction
    -- begun before the enqueue, run after it, is one of them.
    INSERT INTO {schema}.events (name, data, emitted_at)
    VALUES (emit.name, emit.data, clock_timestamp())
    RETURNING id INTO v_event;
    WITH delivered AS (
        UPDATE {schema}.job_event_waits AS w
        SET event_id = v_event, data = emit.data, delivered_at = clock_timestamp()
        FROM {schema}.jobs AS j
        WHERE w.name = emit.name AND w.event_id IS NULL AND NOT w.timed_out
          AND j.id = w.job_id AND j.status IN ('pending', 'running')
        RETURNING w.job_id
    ), woken AS (
        UPDATE {schema}.jobs AS j
        SET woken_at = clock_timestamp(),
            run_at = CASE WHEN j.status = 'pending' THEN least(j.run_at, now()) ELSE j.run_at END,
            updated_at = now()
        WHERE j.id IN (SELECT job_id FROM delivered) AND j.status IN ('pending', 'running')
        RETURNING j.queue
    ), notified AS (
        SELECT pg_notify({jobs_channel}, q.queue) FROM (SELECT DISTINCT queue FROM woken) AS q
    )
    SELECT (SELECT count(*) FROM woken), (SELECT count(*) FROM notified) INTO v_woken, v_queues;
    RETURN v_woken;
END
$$;

COMMENT ON FUNCTION {schema}.emit(text, jsonb) IS
    'Emit an event as pgworker.emit does (docs/guide/events.md): delivered to every job waiting '
    'for it in ctx.wait_for_event, kept for later waits; returns the number of jobs woken. A '
    'refused name: SQLSTATE 22023.';
