-- Failures grouped as people think of them: "the 17 jobs whose customer lookup returned 404",
-- not 17 groups of one because each message carries its own id. Each error gets a fingerprint,
-- `error_group`: 16 hex digits of the md5 of the job's type, the exception's class, its message
-- with the values normalised (error_shape: quoted values, URLs, e-mail addresses, file paths,
-- UUIDs, hex, and every word holding a digit) and the innermost frame of its traceback
-- (file:function, the file's name without its folders, no line number: both survive a deploy).
--
-- Computed in ONE place, the function error_group below, which every statement that writes an
-- error calls: an attempt's outcome from a worker or from an HTTP worker
-- (sql/queries/job_finish_many.sql), the rescue of a job whose worker vanished (jobs_rescue.sql),
-- and this migration's backfill. A SQL function rather than Python, because the rescue and the
-- backfill are SQL with no Python between the row and its write, and a fingerprint must be the
-- same whoever writes it: computed twice, in two languages, two versions would drift.
-- IMMUTABLE (regexp_replace and md5 on its arguments only), PARALLEL SAFE.
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
-- Cost: the two columns are added without a default (no rewrite, a brief exclusive lock). The
-- index build reads `jobs` once under a SHARE lock (writes wait: about 0.2 s per million rows
-- in memory). The backfill writes the jobs that hold an error (failed and cancelled ones along
-- jobs_needs_attention_idx, the pending ones being retried along the claim index: bounded by
-- the dead-letter set and the backlog, not by the table) and only the attempts of the last 7
-- days with an error (along job_attempts_started_idx, a BRIN range); older attempts keep a NULL
-- group, their jobs have theirs. Measured on PostgreSQL 15: about 25 us of regular expressions
-- per row, 100,000 failed jobs and their attempts in about 5 s.

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
        regexp_replace(
            coalesce(message, ''),
            $r$(^|[^[:alnum:]_])'[^']*'$r$, '\1''?''', 'g'),
            $r$(^|[^[:alnum:]_])"[^"]*"$r$, '\1"?"', 'g'),
            $r$[[:alpha:]][[:alnum:]+.-]*://[^[:space:]'"<>]+$r$, '<url>', 'g'),
            $r$[^[:space:]'"<>@(),;:]+@[[:alnum:]-]+(\.[[:alnum:]-]+)+$r$, '<email>', 'g'),
            $r$(^|[[:space:](=,'"])(~|\.{1,2})?(/[^[:space:]/'"(),;:]+){2,}/?$r$, '\1<path>',
            'g'),
            $r$\m[[:alpha:]]:\\[^[:space:]'"]*$r$, '<path>', 'g'),
            $r$[[:xdigit:]]{8}-[[:xdigit:]]{4}-[[:xdigit:]]{4}-[[:xdigit:]]{4}-[[:xdigit:]]{12}$r$,
            '<uuid>', 'g'),
            $r$\m0[xX][[:xdigit:]]+\M$r$, '<hex>', 'g'),
            -- A number alone: digits, with decimals.
            $r$(?:^|(?<=[^[:alnum:]_<>.-]))[0-9]+(?:\.[0-9]+)*(?=$|[^[:alnum:]_<>.-]|\.(?![[:alnum:]]))$r$,
            '<n>', 'g'),
            -- Any other word holding a digit: an id.
            $r$(?:^|(?<=[^[:alnum:]_<>.-]))(?=[[:alnum:]_.-]*[0-9])[[:alnum:]_-]+(?:\.[[:alnum:]_-]+)*(?=$|[^[:alnum:]_<>.-]|\.(?![[:alnum:]]))$r$,
            '<id>', 'g'),
        '[[:space:]]+', ' ', 'g')), 500)
$$;

-- The innermost frame of a Python traceback (the last `File "...", line N, in f` line: that of
-- the exception stored, after any it was raised from), as `file.py:function`, the file without
-- its folders; NULL without one (no traceback, a rescue, an HTTP worker's text in another form).
CREATE FUNCTION {schema}.error_frame(detail text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT regexp_replace(m[1], '^.*[/\\]', '') || ':' || btrim(m[2])
    FROM regexp_match(detail, '.*File "([^"\n]*)", line [0-9]+, in ([^\n]*)') AS m
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

-- A group's jobs, newest first (GET /jobs?error_group=, the console's list) and a bulk action's
-- batches (ids above its cursor): only the jobs that hold an error have an entry.
CREATE INDEX jobs_error_group_idx ON {schema}.jobs (error_group, id)
    WHERE error_group IS NOT NULL;

-- The backfill: the attempts of the last 7 days that hold an error, then each job that holds
-- one, from its latest attempt when that one has the job's error (the rescue writes the job's
-- error in other words than the attempt's: the attempt's is the one grouped), else, but for a
-- job cancelled by an operator or a parent (not a failure: its group is NULL, as such a cancel
-- writes it), from the job's error, read as `Class: message`.
UPDATE {schema}.job_attempts AS a
SET error_group = {schema}.error_group(a.type, a.error_type, a.error_message, a.error_detail)
WHERE a.started_at >= now() - interval '7 days' AND a.error_type IS NOT NULL;

UPDATE {schema}.jobs AS j
SET error_group = coalesce(
        (SELECT {schema}.error_group(a.type, a.error_type, a.error_message, a.error_detail)
         FROM {schema}.job_attempts AS a
         WHERE a.job_id = j.id AND a.attempt = j.attempts AND a.error_type IS NOT NULL
           AND starts_with(j.error, a.error_type)),
        CASE WHEN j.status <> 'cancelled' THEN
            {schema}.error_group(j.type, split_part(j.error, ': ', 1),
                                 substr(j.error, length(split_part(j.error, ': ', 1)) + 3), NULL)
        END)
WHERE j.error IS NOT NULL AND j.status IN ('failed', 'cancelled', 'pending', 'running');
