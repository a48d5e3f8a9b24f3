"""A transactional step cannot escape its transaction: a function that sends
COMMIT, ROLLBACK, BEGIN or savepoint commands, by whatever method, in whatever letter case or
place of a multi-statement string, fails its attempt with a ValidationError before the command
reaches the server; nothing is recorded, and the retry does the effect exactly once. What the
guard cannot see, the transaction-id check before the checkpoint refuses. And the checkpoint is
written in the effect's own transaction: a deferred constraint failing at COMMIT leaves neither."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

import pgworker
from pgworker import ValidationError

from .helpers import has_status, serving_guarded, wait_for
from .test_steps import contexts, step_rows  # noqa: F401  (the fixture)

pytestmark = pytest.mark.asyncio(loop_scope="session")
FAST = pgworker.RetryPolicy(max_retries=3, initial_delay=0.05)

Escape = Callable[[Any], Awaitable[Any]]


async def _prepared(c: Any, sql: str) -> None:
    await (await c.prepare(sql)).fetch()


async def _cursor(c: Any, sql: str) -> None:
    await (await c.cursor(sql)).fetch(1)


ESCAPES: dict[str, tuple[str, Escape]] = {
    "one string": ("COMMIT", lambda c: c.execute("COMMIT; BEGIN")),
    "two calls": ("COMMIT", lambda c: _two(c.execute, "COMMIT", "BEGIN")),
    "rollback": ("ROLLBACK", lambda c: c.execute("ROLLBACK; BEGIN")),
    "lower case": ("COMMIT", lambda c: c.execute("commit; begin")),
    "mixed case": ("COMMIT", lambda c: c.execute("CoMmIt; bEgIn")),
    "after a comment": ("COMMIT", lambda c: c.execute("/* c */ COMMIT; BEGIN")),
    "after a line comment": ("ROLLBACK", lambda c: c.execute("-- c\n  rollback;\nbegin")),
    "after a harmless statement": ("COMMIT", lambda c: c.execute("SELECT 1; COMMIT; BEGIN")),
    "end and start": ("END", lambda c: c.execute("END; START TRANSACTION")),
    "abort": ("ABORT", lambda c: c.execute("ABORT; BEGIN")),
    "fetch": ("COMMIT", lambda c: _two(c.fetch, "COMMIT", "BEGIN")),
    "fetchval": ("COMMIT", lambda c: _two(c.fetchval, "COMMIT", "BEGIN")),
    "fetchrow": ("ROLLBACK", lambda c: _two(c.fetchrow, "ROLLBACK", "BEGIN")),
    "executemany": ("COMMIT", lambda c: c.executemany("COMMIT", [()])),
    "prepare": ("COMMIT", lambda c: _two(lambda q: _prepared(c, q), "COMMIT", "BEGIN")),
    "cursor": ("COMMIT", lambda c: _two(lambda q: _cursor(c, q), "COMMIT", "BEGIN")),
    "caught and ignored": ("COMMIT", lambda c: _swallowed(c, "COMMIT; BEGIN")),
}


async def _two(send: Callable[[str], Awaitable[Any]], first: str, second: str) -> None:
    await send(first)
    await send(second)


async def _swallowed(c: Any, sql: str) -> None:
    """The function catches the refusal and goes on: the step is refused all the same."""
    with contextlib.suppress(ValidationError):
        await c.execute(sql)


def escaping_registry(escape: Escape) -> pgworker.Registry:
    """`effect` writes a row of `effects` (no key: only the step makes it happen once) in a
    transactional step that, on attempt 1, then tries `escape`; attempt 1 fails after the step
    (so that a step recorded by it would not run again), attempt 2 completes."""
    registry = pgworker.Registry()

    @registry.task("effect", retry=FAST)
    async def effect(ctx: pgworker.JobContext, payload: dict[str, Any]) -> int:
        async def write(c: Any) -> int:
            await c.execute("INSERT INTO effects VALUES ($1, $2)", ctx.job_id, ctx.attempt)
            if ctx.attempt == 1:
                await escape(c)
            return ctx.attempt

        done = await ctx.transactional_step("write", write)
        if ctx.attempt == 1:
            raise RuntimeError("fails after the step")
        return int(done)

    return registry


async def attempt_errors(conn: Any, job_id: int) -> list[tuple[str, str | None, str | None]]:
    rows = await conn.fetch(
        "SELECT outcome, error_type, error_message FROM pgworker.job_attempts WHERE job_id = $1 "
        "ORDER BY attempt",
        job_id,
    )
    return [(r["outcome"], r["error_type"], r["error_message"]) for r in rows]


@pytest.mark.parametrize("escape", list(ESCAPES), ids=list(ESCAPES))
async def test_a_step_that_tries_to_end_its_transaction_fails_and_its_retry_writes_once(
    dsn, conn, escape
):
    keyword, send = ESCAPES[escape]
    await conn.execute("CREATE TABLE effects (job_id bigint, attempt int)")
    r = await pgworker.enqueue(conn, "effect", {})
    async with serving_guarded(escaping_registry(send), dsn):
        await wait_for(lambda: has_status(conn, r.job.id, "completed"), timeout=30)
    [first, second] = await attempt_errors(conn, r.job.id)
    assert first[:2] == ("retried", "ValidationError"), first
    assert first[2] is not None
    assert f"sent {keyword}" in first[2] and "async with conn.transaction()" in first[2]
    assert second[:2] == ("completed", None)
    # Attempt 1 recorded nothing: the checkpoint is attempt 2's, and so is the only effect.
    assert [(s["name"], s["attempt"]) for s in await step_rows(conn, r.job.id)] == [("write", 2)]
    effects = await conn.fetch("SELECT job_id, attempt FROM effects")
    assert [(e["job_id"], e["attempt"]) for e in effects] == [(r.job.id, 2)]


# --- what the guard lets through ------------------------------------------------------------


async def test_sql_that_only_mentions_transaction_words_is_sent(contexts, conn):  # noqa: F811
    await conn.execute("CREATE TABLE notes (note text)")
    ctx = await contexts.new()

    async def write(c: Any) -> list[str]:
        await c.execute("INSERT INTO notes VALUES ('COMMIT; BEGIN')")
        await c.execute("INSERT INTO notes VALUES ($1)", "ROLLBACK")
        await c.execute("INSERT INTO notes VALUES ($$ ; commit; begin $$)")
        await c.execute("INSERT INTO notes VALUES ($t$ it's; END $t$)")
        await c.execute("INSERT INTO notes VALUES (E'\\'; COMMIT; --')")
        await c.execute("INSERT INTO notes VALUES ('it''s; rollback')")
        await c.execute('SELECT 1 AS "commit; begin"; -- COMMIT\nSELECT 2 /* ; ROLLBACK */')
        await c.execute("/* outer /* inner */ ; COMMIT */ SELECT 3")
        await c.execute("DO $$ BEGIN INSERT INTO notes VALUES ('from a DO block'); END $$")
        await c.execute(
            "CREATE FUNCTION pg_temp.n() RETURNS int LANGUAGE sql BEGIN ATOMIC "
            "SELECT 1; SELECT CASE WHEN true THEN 2 END; END"
        )
        assert await c.fetchval("SELECT pg_temp.n()") == 2
        assert await c.fetchval("SELECT CASE WHEN $1 THEN 'end' END", True) == "end"
        return [r["note"] for r in await c.fetch("SELECT note FROM notes ORDER BY note")]

    notes = await ctx.transactional_step("notes", write)
    assert len(notes) == 7
    assert await conn.fetchval("SELECT count(*) FROM notes") == 7
    assert [s["name"] for s in await step_rows(conn, ctx.job_id)] == ["notes"]


async def test_savepoints_of_conn_transaction_still_work_inside_a_step(contexts, conn):  # noqa: F811
    await conn.execute("CREATE TABLE effects (n int)")
    ctx = await contexts.new()

    async def write(c: Any) -> int:
        await c.execute("INSERT INTO effects VALUES (1)")
        async with c.transaction():
            await c.execute("INSERT INTO effects VALUES (2)")
        try:
            async with c.transaction():
                await c.execute("INSERT INTO effects VALUES (3)")
                raise LookupError("rolls the savepoint back")
        except LookupError:
            pass
        async with c.transaction(), c.transaction():
            await c.execute("INSERT INTO effects VALUES (4)")
        return 4

    assert await ctx.transactional_step("savepoints", write) == 4
    assert [r["n"] for r in await conn.fetch("SELECT n FROM effects ORDER BY n")] == [1, 2, 4]
    assert [s["name"] for s in await step_rows(conn, ctx.job_id)] == ["savepoints"]


async def test_enqueue_inside_a_step_commits_with_it(contexts, conn):  # noqa: F811
    ctx = await contexts.new()

    async def follow_up(c: Any, order: int) -> int:
        assert isinstance(c, asyncpg.Connection)
        r = await pgworker.enqueue(c, "follow-up", {"order": order})
        await pgworker.enqueue_many(c, [pgworker.JobSpec("follow-up", {"order": order + 1})])
        return r.job.id

    job_id = await ctx.transactional_step("follow-up", follow_up, 7)
    job = await pgworker.get_job(conn, job_id)
    assert job is not None and job.payload == {"order": 7}
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE type = 'follow-up'") == 2

    async def refused(c: Any) -> None:
        await pgworker.enqueue(c, "follow-up", {"order": 9})
        await c.execute("COMMIT")

    with pytest.raises(ValidationError):
        await ctx.transactional_step("refused", refused)
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE type = 'follow-up'") == 2


# --- every command that controls a transaction, refused before it is sent ---------------------


@pytest.mark.parametrize(
    ("sql", "keyword"),
    [
        ("SAVEPOINT s", "SAVEPOINT"),
        ("SAVEPOINT s; ROLLBACK TO SAVEPOINT s", "SAVEPOINT"),
        ("RELEASE SAVEPOINT s", "RELEASE"),
        ("rollback to s", "ROLLBACK"),
        ("PREPARE TRANSACTION 'p'", "PREPARE TRANSACTION"),
        ("COMMIT PREPARED 'p'", "COMMIT"),
        ("ROLLBACK PREPARED 'p'", "ROLLBACK"),
        ("START TRANSACTION", "START"),
        ("\n\t  End", "END"),
        ("SELECT 1;\n/* a /* nested */ comment */ commit", "COMMIT"),
        ("SELECT 'a;b'; SELECT $q$;$q$; ABORT", "ABORT"),
    ],
)
async def test_transaction_control_is_refused_before_it_is_sent(contexts, conn, sql, keyword):  # noqa: F811
    await conn.execute("CREATE TABLE effects (n int)")
    ctx = await contexts.new()
    sent: list[str] = []

    def log(record: Any) -> None:
        sent.append(record.query)

    async def write(c: Any) -> None:
        await c.execute("INSERT INTO effects VALUES (1)")
        c.add_query_logger(log)
        try:
            await c.execute("SELECT 1")
            await c.execute(sql)
        finally:
            c.remove_query_logger(log)

    with pytest.raises(ValidationError, match=f"sent {keyword} ") as e:
        await ctx.transactional_step("refused", write)
    assert e.value.field == "fn" and "async with conn.transaction()" in str(e.value)
    assert sent == ["SELECT 1"]
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0
    assert await step_rows(conn, ctx.job_id) == []


async def test_a_string_read_with_standard_conforming_strings_off_hides_nothing(
    contexts,  # noqa: F811
    conn,
):
    """With standard_conforming_strings off, `'x\\''` ends at its third quote (the backslash
    escapes the second) and the COMMIT after it is a statement the server runs."""
    await conn.execute("CREATE TABLE effects (n int)")
    ctx = await contexts.new()

    async def write(c: Any) -> None:
        await c.execute("SET LOCAL standard_conforming_strings = off")
        await c.execute("INSERT INTO effects VALUES (1)")
        await c.execute("SELECT 'x\\''; COMMIT; BEGIN; --'")

    with pytest.raises(ValidationError, match="sent COMMIT "):
        await ctx.transactional_step("nonstandard", write)
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0
    assert await step_rows(conn, ctx.job_id) == []


async def test_the_connection_refuses_reset_and_close_and_is_useless_after_the_step(
    contexts,  # noqa: F811
    conn,
):
    ctx = await contexts.new()
    kept: list[Any] = []

    async def reset(c: Any) -> None:
        await c.reset()

    async def close(c: Any) -> None:
        await c.close()

    async def terminate(c: Any) -> None:
        c.terminate()

    for end in (reset, close, terminate):
        with pytest.raises(ValidationError, match=f"called conn.{end.__name__}()"):
            await ctx.transactional_step(end.__name__, end)

    async def keep(c: Any) -> int:
        kept.append(c)
        return 1

    assert await ctx.transactional_step("keep", keep) == 1
    with pytest.raises(asyncpg.InterfaceError, match="after its function returned"):
        await kept[0].execute("SELECT 1")
    assert [s["name"] for s in await step_rows(conn, ctx.job_id)] == ["keep"]


# --- the backstop: the transaction's id, checked by the checkpoint itself ---------------------


@pytest.mark.parametrize(
    ("sql", "kept"), [("COMMIT; BEGIN", [1]), ("ROLLBACK; BEGIN", []), ("COMMIT", [1, 2])]
)
async def test_a_step_whose_transaction_changed_unseen_is_not_recorded(
    contexts,  # noqa: F811
    conn,
    monkeypatch,
    sql,
    kept,
):
    """The guard's lexer switched off (as a path it cannot see would be): the command reaches
    the server, and the transaction-id check of the checkpoint refuses to record the step."""
    monkeypatch.setattr("pgworker._steps.connection.transaction_control", lambda sql: None)
    await conn.execute("CREATE TABLE effects (n int)")
    ctx = await contexts.new()

    async def write(c: Any) -> int:
        await c.execute("INSERT INTO effects VALUES (1)")
        await c.execute(sql)
        await c.execute("INSERT INTO effects VALUES (2)")
        return 1

    with pytest.raises(ValidationError, match="transaction id changed") as e:
        await ctx.transactional_step("unseen", write)
    assert e.value.field == "fn"
    assert await step_rows(conn, ctx.job_id) == []
    # What the function committed stays (the reason the guard refuses COMMIT before it is
    # sent: this check comes too late for it); what the new transaction wrote rolls back.
    assert [r["n"] for r in await conn.fetch("SELECT n FROM effects ORDER BY n")] == kept


async def test_a_procedure_that_commits_is_refused_by_postgresql(contexts, conn):  # noqa: F811
    await conn.execute("CREATE TABLE effects (n int)")
    await conn.execute(
        "CREATE PROCEDURE commits() LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO effects VALUES (1); COMMIT; END $$"
    )
    ctx = await contexts.new()

    async def write(c: Any) -> None:
        await c.execute("CALL commits()")

    with pytest.raises(asyncpg.InvalidTransactionTerminationError):
        await ctx.transactional_step("call", write)
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0
    assert await step_rows(conn, ctx.job_id) == []


# --- K: the checkpoint is written in the effect's transaction ---------------------------------


async def test_a_deferred_constraint_failing_at_commit_leaves_neither_effect_nor_checkpoint(
    contexts,  # noqa: F811
    conn,
):
    """The effect violates a constraint checked only at COMMIT: the step's COMMIT fails, and the
    checkpoint, written in that same transaction, goes with the effect. Written on another
    connection, it would have committed alone."""
    await conn.execute(
        "CREATE TABLE effects (k int, CONSTRAINT one_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)"
    )
    ctx = await contexts.new()

    async def write(c: Any) -> int:
        await c.execute("INSERT INTO effects VALUES (1), (1)")  # accepted until COMMIT
        return 1

    with pytest.raises(asyncpg.UniqueViolationError):
        await ctx.transactional_step("deferred", write)
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0
    assert await step_rows(conn, ctx.job_id) == []


# --- the same guard on the testing helpers' connections ---------------------------------------


async def test_run_job_and_drain_refuse_a_step_that_ends_its_transaction(conn):
    from pgworker.testing import drain, run_job

    await conn.execute("CREATE TABLE effects (job_id bigint, attempt int)")
    registry = escaping_registry(lambda c: c.execute("COMMIT; BEGIN"))
    run = await run_job(registry, "effect", conn=conn)
    assert run.status == "pending" and run.error is not None
    assert run.error.startswith("ValidationError: fn: ") and "sent COMMIT" in run.error
    assert run.steps == {}
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0

    r = await pgworker.enqueue(conn, "effect", {})
    ran = await drain(conn, registry, until=timedelta(hours=1))
    assert ran.outcomes() == ["retried", "completed"]
    assert [(s["name"], s["attempt"]) for s in await step_rows(conn, r.job.id)] == [("write", 2)]
    effects = await conn.fetch("SELECT job_id, attempt FROM effects")
    assert [(e["job_id"], e["attempt"]) for e in effects] == [(r.job.id, 2)]


# --- a COMMIT after a routine or a comment ---------------------------------------------------


ROUTINE = "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql "


ESCAPES_AFTER_ROUTINES = {
    "attribute named case": ROUTINE + "BEGIN ATOMIC SELECT x.case FROM (SELECT 1 AS case) x; "
    "END; COMMIT",
    "label after AS": ROUTINE + "BEGIN ATOMIC SELECT 1 AS case; END; COMMIT",
    "bare label": ROUTINE + "BEGIN ATOMIC SELECT 1 case; END; COMMIT",
    "end as a label": ROUTINE + "BEGIN ATOMIC SELECT 1 AS end; END; COMMIT",
    "begin, atomic is no body": ROUTINE + "SET search_path = begin, atomic AS 'select 1'; END",
    # PostgreSQL ends a -- comment at a carriage return as at a newline
    "comment ended by CR": "SELECT 1 -- c\r; COMMIT",
    "comment ended by CR in a body": ROUTINE + "BEGIN ATOMIC SELECT 1; -- c\rEND; COMMIT",
}


@pytest.mark.parametrize(
    "sql", list(ESCAPES_AFTER_ROUTINES.values()), ids=list(ESCAPES_AFTER_ROUTINES)
)
async def test_a_step_cannot_commit_after_a_routine_or_a_comment(
    contexts: Any,  # noqa: F811
    conn: Any,
    sql: str,
) -> None:
    """Sent, each text commits the step's transaction (PostgreSQL reads the body by its grammar):
    the step's effect would stay without its checkpoint, and its retry would make it again."""
    await conn.execute("CREATE TABLE effects (n int)")
    ctx = await contexts.new()

    async def write(c: Any) -> None:
        await c.execute("INSERT INTO effects VALUES (1)")
        await c.execute(sql)

    with pytest.raises(ValidationError, match=r"sent (COMMIT|END) "):
        await ctx.transactional_step("routine", write)
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0
    assert await step_rows(conn, ctx.job_id) == []


async def test_a_step_creates_a_routine_whose_body_names_case_and_end(
    contexts: Any,  # noqa: F811
    conn: Any,
) -> None:
    ctx = await contexts.new()

    async def write(c: Any) -> int:
        await c.execute(
            ROUTINE + "BEGIN ATOMIC SELECT x.case + x.end FROM (SELECT 1 AS case, 2 AS end) x; END"
        )
        return int(await c.fetchval("SELECT pg_temp.f()"))

    assert await ctx.transactional_step("routine", write) == 3
    assert [s["name"] for s in await step_rows(conn, ctx.job_id)] == ["routine"]
