"""The SQL function `pgworker.enqueue(type, payload, queue => ..., ...)`: the
same checks, priorities, idempotency fingerprint, conflict error (SQLSTATE PGW01) and NOTIFY as
the Python helper, tested to agree with it on generated arguments; 50 concurrent calls with one
key give one job; a trigger can enqueue inside the writing transaction."""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgworker
from pgworker import _validate as validate

from .helpers import serving_guarded, wait_for

aio = pytest.mark.asyncio(loop_scope="session")
ROOT = Path(__file__).resolve().parent.parent

ARGUMENTS = [
    "type",
    "payload",
    "queue",
    "priority",
    "max_retries",
    "idempotency_key",
    "correlation_id",
    "run_at",
    "delay",
    "version",
]


def sql_type(name: str, value: Any) -> str:
    """The SQL type a Python value of argument `name` is sent as."""
    if name == "priority":
        if isinstance(value, str) or value is None:
            return "text"
        return "float8" if isinstance(value, float) else "bigint"
    return {
        "type": "text",
        "payload": "jsonb",
        "queue": "text",
        "max_retries": "bigint",
        "idempotency_key": "text",
        "correlation_id": "text",
        "run_at": "timestamptz",
        "version": "bigint",
    }[name]


def call(type_: Any, payload: Any = None, **kw: Any) -> tuple[str, list[Any]]:
    """The SQL function's call with these arguments, as asyncpg sends it: named arguments as
    the README writes them, a delay in seconds as an interval."""
    values: list[Any] = [type_, None if payload is None else json.dumps(payload)]
    named = []
    for name, value in kw.items():
        if value is None:
            continue
        values.append(value.total_seconds() if isinstance(value, timedelta) else value)
        if name == "delay":
            named.append(f"delay => make_interval(secs => ${len(values)}::float8)")
        else:
            named.append(f"{name} => ${len(values)}::{sql_type(name, value)}")
    tail = "".join(f", {n}" for n in named)
    return f"SELECT * FROM pgworker.enqueue($1::text, $2::jsonb{tail})", values


async def sql_enqueue(conn: Any, type_: Any, payload: Any = None, **kw: Any) -> Any:
    statement, values = call(type_, payload, **kw)
    return await conn.fetchrow(statement, *values)


async def count(conn: Any) -> int:
    return await conn.fetchval("SELECT count(*) FROM pgworker.jobs")


@aio
async def test_named_arguments_as_in_python(conn):
    row = await conn.fetchrow(
        "SELECT * FROM pgworker.enqueue('send-invoice', '{\"invoice_id\": 42}', "
        "priority => 'high', queue => 'mail', idempotency_key => 'invoice-42', "
        "delay => '5 minutes', max_retries => 4, correlation_id => 'req-1', version => 2)"
    )
    assert list(row.keys()) == ["id", "created"] and row["created"] is True
    job = await pgworker.get_job(conn, row["id"])
    assert (job.type, job.payload, job.priority, job.queue) == (
        "send-invoice",
        {"invoice_id": 42},
        20,
        "mail",
    )
    assert (job.max_retries, job.correlation_id, job.version) == (4, "req-1", 2)
    assert job.run_at - job.created_at == timedelta(minutes=5)
    stored = await conn.fetchval(
        "SELECT fingerprint = pgworker.fingerprint(type, payload) FROM pgworker.jobs WHERE id = $1",
        row["id"],
    )
    assert stored is True
    plain = await conn.fetchrow("SELECT * FROM pgworker.enqueue('t')")
    job = await pgworker.get_job(conn, plain["id"])
    assert (job.payload, job.queue, job.priority, job.max_retries, job.version) == (
        {},
        "default",
        0,
        None,  # the claim writes the task's max_retries, as for Python's enqueue
        1,
    )
    assert job.correlation_id  # a new UUID
    numbered = await conn.fetchrow("SELECT * FROM pgworker.enqueue('t', '[1]', 'q', 7)")
    assert (await pgworker.get_job(conn, numbered["id"])).priority == 7
    for delay, wait in (("90", timedelta(seconds=90)), ("1 month", timedelta(days=30))):
        row = await conn.fetchrow(
            "SELECT * FROM pgworker.enqueue('t', delay => $1::text::interval)", delay
        )
        job = await pgworker.get_job(conn, row["id"])
        assert job.run_at - job.created_at == wait
    quoted = await conn.fetchrow("SELECT * FROM pgworker.enqueue('t', delay => '90')")
    job = await pgworker.get_job(conn, quoted["id"])
    assert job.run_at - job.created_at == timedelta(seconds=90)
    with pytest.raises(asyncpg.UndefinedFunctionError):  # README: a bare number finds no function
        await conn.fetchrow("SELECT * FROM pgworker.enqueue('t', delay => 90)")


@aio
async def test_psycopg_reads_the_argument_from_the_errors_column(dsn):
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn) as pconn:
        with pytest.raises(psycopg.Error) as caught:
            await pconn.execute("SELECT * FROM pgworker.enqueue('t', priority => %s)", ["urgent"])
        assert caught.value.sqlstate == "22023" and caught.value.diag.column_name == "priority"


@aio
async def test_jsonb_refuses_nul_before_the_function_runs(conn):
    with pytest.raises(asyncpg.PostgresError, match="unsupported Unicode escape sequence"):
        await conn.fetch("SELECT * FROM pgworker.enqueue('t', '{\"a\": \"\\u0000\"}')")


@aio
async def test_idempotency_created_existing_conflict(conn):
    first = await sql_enqueue(conn, "t", {"a": 1, "b": [2]}, idempotency_key="k")
    # The Python helper sees the same key, type and payload as the same job, and back.
    py = await pgworker.enqueue(conn, "t", {"b": [2], "a": 1}, idempotency_key="k", priority=5)
    assert (py.created, py.job.id) == (False, first["id"])
    again = await sql_enqueue(conn, "t", {"b": [2], "a": 1}, idempotency_key="k", queue="other")
    assert (again["id"], again["created"]) == (first["id"], False)
    theirs = await pgworker.enqueue(conn, "t", {"x": 1}, idempotency_key="python")
    mine = await sql_enqueue(conn, "t", {"x": 1}, idempotency_key="python")
    assert (mine["id"], mine["created"]) == (theirs.job.id, False)
    for type_, payload in (("t", {"a": 2}), ("other", {"a": 1, "b": [2]})):
        with pytest.raises(asyncpg.PostgresError) as caught:
            await sql_enqueue(conn, type_, payload, idempotency_key="k")
        assert caught.value.sqlstate == "PGW01"
        assert caught.value.column_name == "idempotency_key"
        assert str(caught.value) == str(pgworker.IdempotencyConflict("k", first["id"]))
    assert await count(conn) == 2
    # PL/pgSQL catches the conflict by its SQLSTATE.
    caught = await conn.fetchval(
        """DO $$ BEGIN
               PERFORM pgworker.enqueue('t', '{"other": 1}', idempotency_key => 'k');
               RAISE EXCEPTION 'not refused';
           EXCEPTION WHEN SQLSTATE 'PGW01' THEN NULL;
           END $$"""
    )
    assert caught is None and await count(conn) == 2


@aio
async def test_fifty_concurrent_calls_with_one_key_give_one_job(pool):
    """Each caller holds its transaction open a moment after the call, so that the others
    wait on the key and then find it taken."""
    results: list[Any] = []
    conflicts: list[Any] = []

    async def one(n: int) -> None:
        async with pool.acquire() as c, c.transaction():
            payload = {"same": True} if n % 10 else {"other": True}
            try:
                results.append(await sql_enqueue(c, "t", payload, idempotency_key="one-key"))
            except asyncpg.PostgresError as exc:
                assert exc.sqlstate == "PGW01", exc
                conflicts.append(n)
                raise
            await c.execute("SELECT pg_sleep(0.02)")

    async def guarded(n: int) -> None:
        with contextlib.suppress(asyncpg.PostgresError):
            await one(n)

    async with anyio.create_task_group() as tg:
        for n in range(50):
            tg.start_soon(guarded, n)
    async with pool.acquire() as c:
        rows = await c.fetch(
            "SELECT id, payload FROM pgworker.jobs WHERE idempotency_key = 'one-key'"
        )
    assert len(rows) == 1
    winner = json.loads(rows[0]["payload"])
    assert len({r["id"] for r in results}) == 1 and results[0]["id"] == rows[0]["id"]
    assert sum(r["created"] for r in results) == 1
    alike = [n for n in range(50) if (n % 10 != 0) == (winner == {"same": True})]
    assert len(results) == len(alike) == 50 - len(conflicts)


REFUSED = [
    ("SELECT * FROM pgworker.enqueue('')", "type", {"type": ""}),
    ("SELECT * FROM pgworker.enqueue(NULL)", "type", {"type": None}),
    (
        f"SELECT * FROM pgworker.enqueue(repeat('t', {validate.MAX_TYPE_LENGTH + 1}))",
        "type",
        {"type": "t" * 201},
    ),
    ("SELECT * FROM pgworker.enqueue('t', queue => '')", "queue", {"queue": ""}),
    (
        "SELECT * FROM pgworker.enqueue('t', queue => "
        f"repeat('q', {validate.MAX_QUEUE_LENGTH + 1}))",
        "queue",
        {"queue": "q" * 64},
    ),
    (
        "SELECT * FROM pgworker.enqueue('t', priority => 'urgent')",
        "priority",
        {"priority": "urgent"},
    ),
    ("SELECT * FROM pgworker.enqueue('t', priority => '20')", "priority", {"priority": "20"}),
    (
        "SELECT * FROM pgworker.enqueue('t', priority => 2147483648)",
        "priority",
        {"priority": 2**31},
    ),
    ("SELECT * FROM pgworker.enqueue('t', priority => 1.5)", "priority", {"priority": 1.5}),
    ("SELECT * FROM pgworker.enqueue('t', priority => true)", "priority", {"priority": True}),
    ("SELECT * FROM pgworker.enqueue('t', max_retries => -1)", "max_retries", {"max_retries": -1}),
    (
        "SELECT * FROM pgworker.enqueue('t', max_retries => 2147483648)",
        "max_retries",
        {"max_retries": 2**31},
    ),
    (
        "SELECT * FROM pgworker.enqueue('t', idempotency_key => '')",
        "idempotency_key",
        {"idempotency_key": ""},
    ),
    (
        "SELECT * FROM pgworker.enqueue('t', idempotency_key => repeat('k', 501))",
        "idempotency_key",
        {"idempotency_key": "k" * 501},
    ),
    (
        "SELECT * FROM pgworker.enqueue('t', correlation_id => '')",
        "correlation_id",
        {"correlation_id": ""},
    ),
    (
        "SELECT * FROM pgworker.enqueue('t', correlation_id => repeat('c', 201))",
        "correlation_id",
        {"correlation_id": "c" * 201},
    ),
    (
        "SELECT * FROM pgworker.enqueue('t', run_at => now(), delay => '1')",
        "run_at",
        {"run_at": datetime.now(UTC), "delay": 1},
    ),
    ("SELECT * FROM pgworker.enqueue('t', run_at => 'infinity')", "run_at", None),
    ("SELECT * FROM pgworker.enqueue('t', run_at => '10000-01-01 00:00:00+00')", "run_at", None),
    ("SELECT * FROM pgworker.enqueue('t', delay => '-1 second')", "delay", {"delay": -1}),
    ("SELECT * FROM pgworker.enqueue('t', delay => '3651 days')", "delay", {"delay": 3651 * 86400}),
    ("SELECT * FROM pgworker.enqueue('t', version => 0)", "version", {"version": 0}),
    (
        "SELECT * FROM pgworker.enqueue('t', (repeat('[', 501) || repeat(']', 501))::jsonb)",
        "payload",
        {"payload": "deep"},
    ),
]


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@aio
@pytest.mark.parametrize(
    ("statement", "field", "python"), REFUSED, ids=[r[0][31:] for r in REFUSED]
)
async def test_the_function_refuses_what_python_refuses_naming_the_argument(
    conn, statement, field, python
):
    with pytest.raises(asyncpg.PostgresError) as caught:
        await conn.fetch(statement)
    assert caught.value.sqlstate == "22023"
    assert caught.value.column_name == field
    assert str(caught.value).startswith(f"{field}: ")
    if python is not None:
        args = {"type": "t", **python}
        if args.get("payload") == "deep":
            args["payload"] = _deep(501)
        with pytest.raises(pgworker.ValidationError) as refused:
            await pgworker.enqueue(conn, args.pop("type"), args.pop("payload", None), **args)
        assert refused.value.field == field
    assert await count(conn) == 0


@aio
async def test_the_limits_are_pythons(conn):
    """The bounds themselves are accepted by both."""
    at_limits = dict(
        queue="q" * validate.MAX_QUEUE_LENGTH,
        priority=validate.MIN_INT,
        max_retries=validate.MAX_INT,
        idempotency_key="k" * validate.MAX_IDEMPOTENCY_KEY_LENGTH,
        correlation_id="c" * validate.MAX_CORRELATION_ID_LENGTH,
        delay=validate.MAX_DELAY,
        version=validate.MAX_INT,
    )
    row = await sql_enqueue(
        conn, "t" * validate.MAX_TYPE_LENGTH, _deep(validate.MAX_DEPTH), **at_limits
    )
    assert row["created"]
    py = await pgworker.enqueue(
        conn, "t" * validate.MAX_TYPE_LENGTH, _deep(validate.MAX_DEPTH), **at_limits
    )
    assert (py.created, py.job.id) == (False, row["id"])


@aio
async def test_the_payload_limit_is_a_setting(conn):
    await conn.execute("SET pgworker.max_payload_bytes = 20")
    await sql_enqueue(conn, "t", {"a": "x" * 10})
    with pytest.raises(
        asyncpg.PostgresError, match=r"payload: is 21 bytes as JSON, over the limit of 20"
    ):
        await sql_enqueue(conn, "t", {"a": "x" * 12})
    await conn.execute("RESET pgworker.max_payload_bytes")
    await sql_enqueue(conn, "t", {"a": "x" * 12})


@pytest.mark.parametrize("bad", ["abc", "-5", "0", "1.5", "20 MB", "1e6", "9" * 30])
@aio
async def test_a_payload_limit_that_is_no_number_of_bytes_is_a_clear_error(conn, bad):
    """Not PostgreSQL's `invalid input syntax for type bigint`: the setting named, what it
    takes, and a SQLSTATE of pgworker's own class."""
    await conn.execute(f"SET pgworker.max_payload_bytes = '{bad}'")
    with pytest.raises(asyncpg.PostgresError) as caught:
        await sql_enqueue(conn, "t", {"a": 1})
    assert caught.value.sqlstate == "PGW02"
    assert str(caught.value).startswith("pgworker.max_payload_bytes: must be a whole number")
    assert repr(bad) in str(caught.value) and "RESET" in str(caught.value)
    # Python's enqueue reads PGWORKER_MAX_PAYLOAD_BYTES, not this setting: it is not refused.
    await pgworker.enqueue(conn, "t", {"a": 1})
    await conn.execute("SET pgworker.max_payload_bytes = ' 20 '")
    assert (await sql_enqueue(conn, "t", {"a": "x" * 10}))["created"]
    assert await count(conn) == 2


DIGITS = 4300
"""The longest whole number Python's json reads (sys.get_int_max_str_digits, by default)."""
UNREADABLE_NUMBERS = {
    "1e5000": '{"v": 1e5000}',
    "-1e5000": '{"v": -1e5000}',
    "4301 digits": '{"v": 1' + "0" * DIGITS + "}",
    "-4301 digits": '{"v": -' + "9" * (DIGITS + 1) + "}",
    "1.0e4300": "[1.0e4300]",
    "nested": '{"a": [1, {"b": [[2.5, "x", ' + "9" * (DIGITS + 1) + "]]}]}",
}


@pytest.mark.parametrize("text", UNREADABLE_NUMBERS.values(), ids=UNREADABLE_NUMBERS.keys())
@aio
async def test_a_whole_number_python_cannot_read_is_refused(conn, text):
    """jsonb writes 1e5000 out as 5,001 digits: stored, every Python worker failed the job as
    InvalidPayload (json.loads refuses an int of more than 4,300 digits), and `pgworker show`
    said the row was written around pgworker's checks. Python's enqueue cannot write such a
    number (json.dumps refuses it), nor HTTP (its body is read by json.loads)."""
    with pytest.raises(ValueError, match="4300 digits"):
        json.loads(await conn.fetchval("SELECT $1::jsonb::text", text))
    with pytest.raises(asyncpg.PostgresError) as caught:
        await conn.fetch("SELECT * FROM pgworker.enqueue('t', $1::jsonb)", text)
    assert caught.value.sqlstate == "22023" and caught.value.column_name == "payload"
    assert str(caught.value).startswith(
        "payload: must not hold a whole number of more than 4300 digits"
    )
    assert await count(conn) == 0


@aio
async def test_numbers_python_reads_are_stored_and_read_back(conn):
    """At the limit, and decimals of any length (Python reads them as floats): not refused."""
    readable = {
        "at_limit": int("9" * DIGITS),
        "negative": -int("9" * DIGITS),
        "long_array": [int("1" * DIGITS)] * 3,
    }
    tiny = "0." + "0" * 4999 + "1"
    large = "9" * (DIGITS + 1) + ".5"
    text = json.dumps(readable)[:-1] + f', "tiny": {tiny}, "large": {large}}}'
    row = await conn.fetchrow("SELECT * FROM pgworker.enqueue('t', $1::jsonb)", text)
    job = await pgworker.get_job(conn, row["id"])
    assert job is not None
    assert job.payload == {**readable, "tiny": 0.0, "large": float("inf")}


# The payloads equal as JSON values that each pair holds (numbers by value, at any depth), and
# pairs that differ (1 and 2; true is not 1; ints past a float's precision stay apart).
EQUAL_PAYLOADS = [
    ({"a": 1}, {"a": 1.0}),
    ({"n": {"x": [1, {"y": 2.50}]}}, {"n": {"x": [1.0, {"y": 2.5}]}}),
    ({"a": 100}, '{"a": 1e2}'),
    ([0], [-0.0]),
]
OTHER_PAYLOADS = [
    ({"a": 1}, {"a": 2}),
    ({"a": 1}, {"a": True}),
    ({"a": 2**53 + 1}, {"a": float(2**53)}),
    ({"a": 2**63}, {"a": 2**63 + 1}),
]


def as_json(payload: Any) -> str:
    """A payload's JSON text; a str is JSON text already (`1e2`, which Python never writes)."""
    return payload if isinstance(payload, str) else json.dumps(payload)


@aio
async def test_equal_json_values_are_the_same_payload(conn):
    """{"a": 1} then {"a": 1.0} with one key: the existing job, from SQL and Python alike, in
    either order; a different value still conflicts."""
    for n, (first, second) in enumerate(EQUAL_PAYLOADS):
        key = f"equal-{n}"
        made = await conn.fetchrow(
            "SELECT * FROM pgworker.enqueue('t', $1::jsonb, idempotency_key => $2)",
            as_json(first),
            key,
        )
        again = await conn.fetchrow(
            "SELECT * FROM pgworker.enqueue('t', $1::jsonb, idempotency_key => $2)",
            as_json(second),
            key,
        )
        assert (again["id"], again["created"]) == (made["id"], False), (first, second)
        if not isinstance(second, str):
            py = await pgworker.enqueue(conn, "t", second, idempotency_key=key)
            assert (py.job.id, py.created) == (made["id"], False)
    for n, (first, second) in enumerate(OTHER_PAYLOADS):
        key = f"other-{n}"
        await pgworker.enqueue(conn, "t", first, idempotency_key=key)
        with pytest.raises(asyncpg.PostgresError) as caught:
            await sql_enqueue(conn, "t", second, idempotency_key=key)
        assert caught.value.sqlstate == "PGW01", (first, second)
        with pytest.raises(pgworker.IdempotencyConflict):
            await pgworker.enqueue(conn, "t", second, idempotency_key=key)
    assert await count(conn) == len(EQUAL_PAYLOADS) + len(OTHER_PAYLOADS)


@aio
async def test_a_null_payload_is_an_empty_object_as_in_python(conn):
    """JSON null, SQL NULL and Python's None are one payload, `{}`: the same row, and one key
    shared by all of them is one job."""
    sql_null = await conn.fetchrow(
        "SELECT * FROM pgworker.enqueue('t', 'null', idempotency_key => 'k')"
    )
    assert sql_null["created"]
    py = await pgworker.enqueue(conn, "t", None, idempotency_key="k")
    assert (py.job.id, py.created) == (sql_null["id"], False)
    missing = await conn.fetchrow(
        "SELECT * FROM pgworker.enqueue('t', NULL, idempotency_key => 'k')"
    )
    assert (missing["id"], missing["created"]) == (sql_null["id"], False)
    explicit = await sql_enqueue(conn, "t", {}, idempotency_key="k")
    assert (explicit["id"], explicit["created"]) == (sql_null["id"], False)
    unkeyed = await conn.fetchrow("SELECT * FROM pgworker.enqueue('t', 'null')")
    python = await pgworker.enqueue(conn, "t", None)
    rows = await conn.fetch(
        "SELECT payload, fingerprint FROM pgworker.jobs WHERE id = ANY($1::bigint[]) ORDER BY id",
        [sql_null["id"], unkeyed["id"], python.job.id],
    )
    assert [r["payload"] for r in rows] == ["{}"] * 3
    assert rows[0]["fingerprint"] == await conn.fetchval("SELECT pgworker.fingerprint('t', '{}')")


async def migrated_to(conn: Any, last: int) -> None:
    """The schema as `pgworker migrate` of a version whose newest migration was `last` left it."""
    from pgworker._db import files
    from pgworker._db.queries import queries

    q = queries("pgworker")
    await q.migrations_bootstrap(conn)
    for m in files.migrations("pgworker"):
        if m.version <= last:
            async with conn.transaction():
                await conn.execute(m.sql)
                await q.migrations_record(conn, m.version, m.name)


@aio
async def test_keys_taken_before_migration_10_still_match_after_it(empty_dsn):
    """Jobs enqueued by migration 9's function (and so with the fingerprints Python's enqueue
    wrote then, which the test checks): retried after the upgrade with the same payload, from
    SQL or Python, each is found (created=False); a JSON null kept then is the {} of now."""
    conn = await asyncpg.connect(empty_dsn)
    try:
        await migrated_to(conn, 9)
        before = {}
        for key, payload in (("plain", '{"a": 1, "b": [1.5, "é"]}'), ("null", "null")):
            row = await conn.fetchrow(
                "SELECT * FROM pgworker.enqueue('t', $1::jsonb, idempotency_key => $2)",
                payload,
                key,
            )
            before[key] = row["id"]
        assert await conn.fetchval(
            "SELECT bool_and(fingerprint = md5(type || chr(31) || payload::text)) "
            "FROM pgworker.jobs"
        )
        assert (
            await conn.fetchval("SELECT payload FROM pgworker.jobs WHERE id = $1", before["null"])
            == "null"
        )
        assert (await pgworker.migrate(conn))[:1] == [10]
        for payload in ({"a": 1, "b": [1.5, "é"]}, {"b": [1.50, "é"], "a": 1.0}):
            py = await pgworker.enqueue(conn, "t", payload, idempotency_key="plain")
            assert (py.job.id, py.created) == (before["plain"], False)
            row = await sql_enqueue(conn, "t", payload, idempotency_key="plain")
            assert (row["id"], row["created"]) == (before["plain"], False)
        py = await pgworker.enqueue(conn, "t", None, idempotency_key="null")
        assert (py.job.id, py.created) == (before["null"], False)
        row = await conn.fetchrow(
            "SELECT * FROM pgworker.enqueue('t', 'null', idempotency_key => 'null')"
        )
        assert (row["id"], row["created"]) == (before["null"], False)
        [many] = await pgworker.enqueue_many(
            conn, [pgworker.JobSpec("t", None, idempotency_key="null")]
        )
        assert (many.job.id, many.created) == (before["null"], False)
        with pytest.raises(pgworker.IdempotencyConflict):
            await pgworker.enqueue(conn, "t", {"a": 2}, idempotency_key="plain")
        assert await count(conn) == 2
    finally:
        await conn.close()


@aio
async def test_notify_on_commit_only(conn, dsn):
    got: list[str] = []
    listener = await asyncpg.connect(dsn)
    try:
        await listener.add_listener("pgworker_jobs", lambda *args: got.append(args[3]))
        async with conn.transaction():
            await sql_enqueue(conn, "t", queue="committed")
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await sql_enqueue(conn, "t", queue="rolled-back")
                raise RuntimeError
        await wait_for(lambda: got)
        await listener.execute("SELECT 1")
        assert [json.loads(p)["queue"] for p in got] == ["committed"]
    finally:
        await listener.close()


TRIGGER = (ROOT / "examples" / "recipes" / "enqueue_trigger.sql").read_text()


@aio
@pytest.mark.fresh_db  # its table's primary key and trigger are not undone by a reset
async def test_a_trigger_enqueues_in_the_writing_transaction(conn, dsn):
    await conn.execute(TRIGGER)
    order_id = await conn.fetchval("INSERT INTO orders (total) VALUES (12.5) RETURNING id")
    with pytest.raises(RuntimeError):
        async with conn.transaction():
            await conn.execute("INSERT INTO orders (total) VALUES (99)")
            raise RuntimeError
    rows = await conn.fetch("SELECT type, payload, priority, idempotency_key FROM pgworker.jobs")
    assert [dict(r) for r in rows] == [
        {
            "type": "send-receipt",
            "payload": json.dumps({"order_id": order_id}),
            "priority": 20,
            "idempotency_key": f"receipt-{order_id}",
        }
    ]
    # A worker runs what the trigger enqueued.
    done: list[Any] = []
    registry = pgworker.Registry()

    @registry.task("send-receipt")
    async def send_receipt(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        done.append(payload)

    async with serving_guarded(registry, dsn):
        await wait_for(lambda: done)
    assert done == [{"order_id": order_id}]


# --- the function and the Python helper agree -----------------------------------------------

# Each argument is mostly valid (a branch of one_of is picked evenly: valid ones are repeated),
# so that created rows, existing jobs and conflicts come up as well as each refusal.
storable = st.characters(codec="utf-8", exclude_characters="\x00")
valid_text = st.text(storable, min_size=1, max_size=12)


def at_limit(limit: int) -> st.SearchStrategy[str]:
    """Text of exactly `limit` characters, or one more: each side's bound is compared. Mostly
    characters of several UTF-8 bytes, so that a bound counted in bytes disagrees too."""
    return st.builds(
        lambda head, n: (head * n)[:n],
        st.text(storable, min_size=1, max_size=3),
        st.sampled_from([limit, limit + 1]),
    )


def names(limit: int) -> st.SearchStrategy[str | None]:
    return st.one_of(st.none(), st.none(), valid_text, valid_text, st.just(""), at_limit(limit))


keys = st.one_of(
    st.none(),
    st.none(),
    st.just("taken"),
    st.just("taken"),
    valid_text,
    st.just(""),
    at_limit(validate.MAX_IDEMPOTENCY_KEY_LENGTH),
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**62), 2**62)
    | st.sampled_from([10 ** (DIGITS - 1), 1 - 10**DIGITS])  # the longest ints Python reads
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(storable, max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(storable, max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
payloads = st.one_of(
    st.just({}),
    st.just({}),
    json_values,
    st.sampled_from([_deep(500), _deep(501), {"a": _deep(499)}, {"a": _deep(500)}]),
)
types = st.one_of(
    *[st.just("t")] * 3, valid_text, valid_text, st.just(""), at_limit(validate.MAX_TYPE_LENGTH)
)
priorities = st.one_of(
    st.none(),
    st.none(),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**33), 2**33),
    st.sampled_from(["low", "medium", "high", "critical", "urgent", "", "20"]),
    st.floats(-10, 10),
)
run_ats = st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2100, 1, 1),
    timezones=st.just(UTC) | st.just(timezone(timedelta(hours=5))),
)
delays = st.one_of(  # in whole microseconds: an interval holds no less (-1e-38 s is 0 in SQL)
    st.floats(-10, 1e6).map(lambda seconds: round(seconds, 6)),
    st.just(1e12),
    st.integers(-10, 10**6),
    st.timedeltas(min_value=timedelta(seconds=-5), max_value=timedelta(days=30)),
)
schedules = st.one_of(
    st.just((None, None)),
    st.just((None, None)),
    st.tuples(run_ats, st.none()),
    st.tuples(st.none(), delays),
    st.tuples(run_ats, delays),
)
retries = st.one_of(st.none(), st.none(), st.integers(-5, 2**32))
versions = st.one_of(st.none(), st.none(), st.integers(-2, 3), st.just(2**31))


_connections: dict[str, asyncpg.Connection] = {}


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    # The scratch database, and so each connection's server side, is dropped by then.
    for conn in _connections.values():
        conn.terminate()
    loop.close()


COMPARED = (
    "type",
    "queue",
    "payload",
    "priority",
    "status",
    "max_retries",
    "idempotency_key",
    "fingerprint",
    "version",
    "run_at_given",
)


async def _outcome(conn: Any, enqueue: Any) -> tuple[Any, ...]:
    """What an enqueue did, in a transaction rolled back afterwards: ("refused", field),
    ("conflict",), ("existing", id) or ("created", the row's compared columns)."""
    tx = conn.transaction()
    await tx.start()
    try:
        try:
            job_id, created = await enqueue()
        except pgworker.ValidationError as exc:
            return ("refused", exc.field)
        except pgworker.IdempotencyConflict:
            return ("conflict",)
        except asyncpg.PostgresError as exc:
            if exc.sqlstate == "PGW01":
                return ("conflict",)
            assert exc.sqlstate == "22023", exc
            assert str(exc).startswith(f"{exc.column_name}: ")
            return ("refused", exc.column_name)
        if not created:
            return ("existing", job_id)
        row = await conn.fetchrow(
            "SELECT *, CASE WHEN run_at - created_at = interval '0' THEN NULL "
            "ELSE run_at - created_at END AS wait, run_at AS run_at_given "
            "FROM pgworker.jobs WHERE id = $1",
            job_id,
        )
        values = {c: row[c] for c in COMPARED}
        values["wait"] = row["wait"]
        values["correlation_id"] = (
            row["correlation_id"] if len(row["correlation_id"]) != 36 else None
        )
        return ("created", values)
    finally:
        await tx.rollback()


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    type_=types,
    payload=payloads,
    queue=names(validate.MAX_QUEUE_LENGTH),
    priority=priorities,
    retries=retries,
    key=keys,
    correlation=names(validate.MAX_CORRELATION_ID_LENGTH),
    schedule=schedules,
    version=versions,
)
def test_the_function_and_python_agree(
    loop, dsn, type_, payload, queue, priority, retries, key, correlation, schedule, version
):
    """The same arguments are refused by both (the same argument named), or make the same row,
    or find the same existing job, or meet the same conflict (an existing job holds `taken`)."""

    run_at, delay = schedule

    async def attempt() -> None:
        conn = _connections.get(dsn)
        if conn is None:
            conn = _connections[dsn] = await asyncpg.connect(dsn)
            await conn.execute("DELETE FROM pgworker.jobs")
            await pgworker.enqueue(conn, "t", {}, idempotency_key="taken")
        options = dict(
            queue=queue,
            priority=priority,
            max_retries=retries,
            idempotency_key=key,
            correlation_id=correlation,
            run_at=run_at,
            delay=delay,
            version=version,
        )

        async def python() -> tuple[int, bool]:
            r = await pgworker.enqueue(conn, type_, payload, **options)
            return r.job.id, r.created

        async def sql() -> tuple[int, bool]:
            row = await sql_enqueue(conn, type_, payload, **options)
            return row["id"], row["created"]

        expected = await _outcome(conn, python)
        got = await _outcome(conn, sql)
        if expected[0] == got[0] == "created":
            # A given run_at is compared; else the wait from the database's clock.
            for values in (expected[1], got[1]):
                values.pop("run_at_given" if run_at is None else "wait")
        assert got == expected

    loop.run_until_complete(attempt())
