-- Failures grouped as people think of them: "the 17 jobs whose customer lookup returned 404",
-- not 17 groups of one because each message carries its own id. Each error gets a fingerprint,
-- `error_group`: 16 hex digits of the md5 of the job's type, the exception's class, its message
-- with the values normalised (error_shape: quoted values, URLs, e-mail addresses, file paths,
-- UUIDs, hex, and every word holding a digit) and the innermost frame of its traceback
-- (file:function, the file's name without its folders, no line number: both survive a deploy).
--
-- Computed in ONE place, the function error_group below, which every statement that writes a
-- failure's error calls (a cancel by an operator or a parent is no failure: no group): an
-- attempt's outcome from a worker or from an HTTP worker (sql/queries/job_finish_many.sql), the
-- rescue of a job whose worker vanished (jobs_rescue.sql), and this migration's backfill. A SQL
-- function rather than Python, because the rescue and the backfill are SQL with no Python
-- between the row and its write, and a fingerprint must be the same whoever writes it:
-- computed twice, in two languages, two versions would drift.
-- IMMUTABLE (regular expressions, string functions and md5 of its arguments only), PARALLEL
-- SAFE.
--
-- Stored on `job_attempts` with the attempt's error (every attempt that has one: retried, lost,
-- timed out, failed), and on `jobs` for the job's latest error (NULL while it has none: a
-- completed or replayed job's is cleared with its error), so that the lists and bulk actions
-- filter by it (`error_group` in the jobs filter) along the partial index below. The attempts'
-- column is not indexed: the groups of retried attempts are read within a time range along
-- job_attempts_started_idx, and an index on it would make the close of every failed attempt a
-- non-HOT update.
--
-- Rows written by workers of an earlier release during a rolling upgrade carry no group: they
-- show in the lists, but not in the groups, until they fail again under this release.
--
-- Cost, and the lock: the two columns are added without a default (no rewrite), but the ALTER's
-- exclusive lock on `jobs` and `job_attempts` is held until the migration commits, so workers
-- wait for the whole backfill. It is therefore bounded: only the attempts of the last 7 days
-- that hold an error (a range of job_attempts_started_idx, a BRIN index), the jobs still being
-- retried (pending or running with an error) and those failed or cancelled in the last 7 days
-- (a range of jobs_finished_idx); older failures keep a NULL group (they stay in the lists and
-- in `error` searches, not in the groups). Then one index build, which reads `jobs` once. The
-- functions cost about 60 us per failure (the message's shape; the traceback's frame is read
-- with string functions). Measured on PostgreSQL 15 on a shared 2-core machine under a load
-- average of 15: 100,000 failures of the last 7 days (each job and its attempt) in 34 s (21.7 s
-- for the attempts, 11.2 s for the jobs, 1.1 s for the index), of which a plain UPDATE of the
-- same rows takes about 19 s: about 0.3 ms per failure there (so about 3 s for 10,000).

-- The message's shape: what stays of it once its values are normalised, at most 500
-- characters. The order matters: quoted values first (they may hold anything), then the tokens
-- that hold punctuation (URLs, e-mail addresses, paths), then UUIDs and hex, and last every word
-- holding a digit (ids such as ord_8f3a2 or web-3-12345-a1b2c3, numbers such as 404 or 30.5).
-- A quote that follows a letter is an apostrophe ("can't"), not the start of a value.
CREATE FUNCTION {schema}.error_shape(message text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
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
$$;

-- The innermost frame of a Python traceback (the last `File "...", line N, in f` line: that of
-- the exception stored, after any it was raised from), as `file.py:function`, the file without
-- its folders; NULL without one (no traceback, a rescue, an HTTP worker's text in another form).
CREATE FUNCTION {schema}.error_frame(detail text)
RETURNS text LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
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

-- The fingerprint: NULL without an error class (no error).
CREATE FUNCTION {schema}.error_group(job_type text, error_class text, message text,
                                     detail text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN error_class IS NOT NULL THEN
        left(md5(concat(coalesce(job_type, ''), E'\x1f', error_class, E'\x1f',
                        {schema}.error_shape(message), E'\x1f',
                        coalesce({schema}.error_frame(detail), ''))), 16)
    END
$$;

GRANT EXECUTE ON FUNCTION {schema}.error_shape(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION {schema}.error_frame(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION {schema}.error_group(text, text, text, text) TO PUBLIC;

ALTER TABLE {schema}.jobs ADD COLUMN error_group text;
ALTER TABLE {schema}.job_attempts ADD COLUMN error_group text;

-- The backfill, of the last 7 days only: the attempts that hold an error, then each job that
-- holds one (those still being retried, and those that failed or were cancelled in the last 7
-- days), from its latest attempt when that one has the job's error (the rescue writes the job's
-- error in other words than the attempt's: the attempt's is the one grouped), else, but for a
-- job cancelled by an operator or a parent (not a failure: its group is NULL, as such a cancel
-- writes it), from the job's error, read as `Class: message`.
UPDATE {schema}.job_attempts AS a
SET error_group = {schema}.error_group(a.type, a.error_type, a.error_message, a.error_detail)
WHERE a.started_at >= now() - interval '7 days' AND a.error_type IS NOT NULL;

UPDATE {schema}.jobs AS j
SET error_group = coalesce(
        (SELECT coalesce(a.error_group,
                         {schema}.error_group(a.type, a.error_type, a.error_message,
                                              a.error_detail))
         FROM {schema}.job_attempts AS a
         WHERE a.job_id = j.id AND a.attempt = j.attempts AND a.error_type IS NOT NULL
           AND starts_with(j.error, a.error_type)),
        CASE WHEN j.status <> 'cancelled' THEN
            {schema}.error_group(j.type, split_part(j.error, ': ', 1),
                                 substr(j.error, length(split_part(j.error, ': ', 1)) + 3), NULL)
        END)
WHERE j.error IS NOT NULL
  AND (j.status IN ('pending', 'running')
       OR (j.status IN ('failed', 'cancelled') AND j.finished_at >= now() - interval '7 days'));

-- A group's jobs, newest first (GET /jobs?error_group=, the console's list) and a bulk action's
-- batches (ids above its cursor): only the jobs that hold an error have an entry.
CREATE INDEX jobs_error_group_idx ON {schema}.jobs (error_group, id)
    WHERE error_group IS NOT NULL;

