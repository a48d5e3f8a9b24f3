"""Enqueue through every driver: asyncpg, psycopg 3 (async and sync),
SQLAlchemy (AsyncConnection, AsyncSession, Connection, Session), Django's connection, and the SQL
function give the same row and the same idempotency behaviour (created, existing, conflict);
a rollback leaves nothing; bad connections get a clear error and write nothing. The Django
example (examples/django_app) runs against the real PostgreSQL."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import psycopg
import pytest
import pytest_asyncio
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import pgworker
import pgworker.sync
from pgworker import EnqueueResult, IdempotencyConflict, JobSpec

from .helpers import wait_for

aio = pytest.mark.asyncio(loop_scope="session")
ROOT = Path(__file__).resolve().parent.parent
MANAGE = [sys.executable, "-m", "examples.django_app.manage"]

# Columns every path must write alike (ids, and the times the database chose, differ).
COMPARED = (
    "type",
    "queue",
    "payload",
    "priority",
    "status",
    "max_retries",
    "idempotency_key",
    "fingerprint",
    "correlation_id",
    "version",
    "retry_count",
    "attempts",
)


def url(dsn: str, scheme: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(scheme=scheme))


class Rollback(Exception):
    """Raised inside a transaction to roll it back."""


class Via:
    """One way to enqueue, each call in a transaction of its own that commits, or rolls back
    when `rollback` is set."""

    name = "?"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    async def __aenter__(self) -> Via:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def enqueue(self, *args: Any, rollback: bool = False, **kw: Any) -> EnqueueResult:
        raise NotImplementedError

    async def enqueue_many(self, specs: list[JobSpec], rollback: bool = False) -> Any:
        raise NotImplementedError


class ViaAsyncpg(Via):
    name = "asyncpg"

    async def __aenter__(self) -> Via:
        self.conn = await asyncpg.connect(self.dsn)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def _run(self, call: Callable[[Any], Any], rollback: bool) -> Any:
        with contextlib.suppress(Rollback):
            async with self.conn.transaction():
                result = await call(self.conn)
                if rollback:
                    raise Rollback
        return result

    async def enqueue(self, *args: Any, rollback: bool = False, **kw: Any) -> EnqueueResult:
        return await self._run(lambda c: pgworker.enqueue(c, *args, **kw), rollback)

    async def enqueue_many(self, specs: list[JobSpec], rollback: bool = False) -> Any:
        return await self._run(lambda c: pgworker.enqueue_many(c, specs), rollback)


class ViaPsycopgAsync(Via):
    name = "psycopg AsyncConnection"

    async def __aenter__(self) -> Via:
        self.conn = await psycopg.AsyncConnection.connect(self.dsn)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def _run(self, call: Callable[[Any], Any], rollback: bool) -> Any:
        try:
            result = await call(self.conn)
        except BaseException:
            await self.conn.rollback()
            raise
        await (self.conn.rollback() if rollback else self.conn.commit())
        return result

    async def enqueue(self, *args: Any, rollback: bool = False, **kw: Any) -> EnqueueResult:
        return await self._run(lambda c: pgworker.enqueue(c, *args, **kw), rollback)

    async def enqueue_many(self, specs: list[JobSpec], rollback: bool = False) -> Any:
        return await self._run(lambda c: pgworker.enqueue_many(c, specs), rollback)


class ViaPsycopgSync(Via):
    name = "psycopg Connection"

    async def __aenter__(self) -> Via:
        self.conn = psycopg.connect(self.dsn)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.conn.close()

    def _run(self, call: Callable[[Any], Any], rollback: bool) -> Any:
        try:
            result = call(self.conn)
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.rollback() if rollback else self.conn.commit()
        return result

    async def enqueue(self, *args: Any, rollback: bool = False, **kw: Any) -> EnqueueResult:
        return self._run(lambda c: pgworker.sync.enqueue(c, *args, **kw), rollback)

    async def enqueue_many(self, specs: list[JobSpec], rollback: bool = False) -> Any:
        return self._run(lambda c: pgworker.sync.enqueue_many(c, specs), rollback)


class ViaSQLAlchemyAsyncConnection(Via):
    name = "SQLAlchemy AsyncConnection (asyncpg)"

    async def __aenter__(self) -> Via:
        self.engine = create_async_engine(url(self.dsn, "postgresql+asyncpg"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.engine.dispose()

    async def _run(self, call: Callable[[Any], Any], rollback: bool) -> Any:
        async with self.engine.connect() as conn:
            result = await call(conn)
            await (conn.rollback() if rollback else conn.commit())
        return result

    async def enqueue(self, *args: Any, rollback: bool = False, **kw: Any) -> EnqueueResult:
        return await self._run(lambda c: pgworker.enqueue(c, *args, **kw), rollback)

    async def enqueue_many(self, specs: list[JobSpec], rollback: bool = False) -> Any:
        return await self._run(lambda c: pgworker.enqueue_many(c, specs), rollback)


class ViaSQLAlchemyAsyncSession(ViaSQLAlchemyAsyncConnection):
    name = "SQLAlchemy AsyncSession (psycopg)"

    async def __aenter__(self) -> Via:
        self.engine = create_async_engine(url(self.dsn, "postgresql+psycopg"))
        return self

    async def _run(self, call: Callable[[Any], Any], rollback: bool) -> Any:
        async with AsyncSession(self.engine) as session:
            result = await call(session)
            await (session.rollback() if rollback else session.commit())
        return result


class ViaSQLAlchemyConnection(Via):
    name = "SQLAlchemy Connection (psycopg)"

    async def __aenter__(self) -> Via:
        self.engine = create_engine(url(self.dsn, "postgresql+psycopg"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.engine.dispose()

    def _run(self, call: Callable[[Any], Any], rollback: bool) -> Any:
        with self.engine.connect() as conn:
            result = call(conn)
            conn.rollback() if rollback else conn.commit()
        return result

    async def enqueue(self, *args: Any, rollback: bool = False, **kw: Any) -> EnqueueResult:
        return self._run(lambda c: pgworker.sync.enqueue(c, *args, **kw), rollback)

    async def enqueue_many(self, specs: list[JobSpec], rollback: bool = False) -> Any:
        return self._run(lambda c: pgworker.sync.enqueue_many(c, specs), rollback)


class ViaSQLAlchemySession(ViaSQLAlchemyConnection):
    name = "SQLAlchemy Session (psycopg)"

    def _run(self, call: Callable[[Any], Any], rollback: bool) -> Any:
        with Session(self.engine) as session:
            result = call(session)
            session.rollback() if rollback else session.commit()
        return result


class ViaDjango(Via):
    name = "Django connection"

    async def __aenter__(self) -> Via:
        await in_django(django_database, self.dsn)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await in_django(close_django)

    def _run(self, call: Callable[[Any], Any], rollback: bool) -> Any:
        from django.db import connection, transaction

        with contextlib.suppress(Rollback), transaction.atomic():
            result = call(connection)
            if rollback:
                raise Rollback
        return result

    async def enqueue(self, *args: Any, rollback: bool = False, **kw: Any) -> EnqueueResult:
        return await in_django(self._run, lambda c: pgworker.sync.enqueue(c, *args, **kw), rollback)

    async def enqueue_many(self, specs: list[JobSpec], rollback: bool = False) -> Any:
        return await in_django(self._run, lambda c: pgworker.sync.enqueue_many(c, specs), rollback)


class ViaSQLFunction(ViaAsyncpg):
    """The SQL function, called with named arguments; its conflict (SQLSTATE PGW01) is told
    apart here as IdempotencyConflict."""

    name = "SQL function"

    async def enqueue(self, *args: Any, rollback: bool = False, **kw: Any) -> EnqueueResult:
        type_, payload = args
        names = {
            "queue": "text",
            "priority": "text" if isinstance(kw.get("priority"), str) else "bigint",
            "correlation_id": "text",
            "max_retries": "bigint",
            "idempotency_key": "text",
            "run_at": "timestamptz",
            "version": "bigint",
        }
        values: list[Any] = [type_, pgworker_json(payload)]
        named = []
        for name, value in kw.items():
            if name == "delay":
                named.append(f"delay => make_interval(secs => ${len(values) + 1}::float8)")
            else:
                named.append(f"{name} => ${len(values) + 1}::{names[name]}")
            values.append(value)
        statement = (
            "SELECT * FROM pgworker.enqueue($1, $2::jsonb" + "".join(", " + n for n in named) + ")"
        )

        async def call(conn: Any) -> EnqueueResult:
            try:
                row = await conn.fetchrow(statement, *values)
            except asyncpg.PostgresError as exc:
                if exc.sqlstate == "PGW01":
                    raise IdempotencyConflict(kw["idempotency_key"], None) from exc
                raise
            job = await pgworker.get_job(conn, row["id"])
            return EnqueueResult(job, row["created"])

        return await self._run(call, rollback)


def pgworker_json(value: Any) -> str:
    import json

    return json.dumps(value)


VIAS = [
    ViaAsyncpg,
    ViaPsycopgAsync,
    ViaPsycopgSync,
    ViaSQLAlchemyAsyncConnection,
    ViaSQLAlchemyAsyncSession,
    ViaSQLAlchemyConnection,
    ViaSQLAlchemySession,
    ViaDjango,
    ViaSQLFunction,
]


_DJANGO = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="django")


async def in_django(call: Callable[..., Any], *args: Any) -> Any:
    """`call(*args)` in the one thread where these tests use Django (its connections belong to
    a thread, and it refuses to run inside an event loop)."""
    return await asyncio.wrap_future(_DJANGO.submit(call, *args))


def django_database(dsn: str) -> None:
    """Django set up once per process with the example's settings, its default database made
    `dsn`'s (each test has its own database)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
    import django
    from django.db import connection

    from examples.django_app.settings import database

    django.setup()
    connection.close()
    connection.settings_dict.update(database(dsn))


def close_django() -> None:
    from django.db import connection

    connection.close()


async def row_of(conn: Any, job_id: int) -> dict[str, Any]:
    row = await conn.fetchrow(
        "SELECT *, run_at - created_at AS wait FROM pgworker.jobs WHERE id = $1", job_id
    )
    return dict(row)


@pytest_asyncio.fixture(loop_scope="session", params=VIAS, ids=lambda v: v.name)
async def via(request: Any, dsn: str) -> AsyncIterator[Via]:
    async with request.param(dsn) as v:
        yield v


@aio
async def test_the_same_enqueue_gives_the_same_row_and_idempotency(via, conn):
    """created, then existing (created=False, the same job), then conflict; the row as
    asyncpg's enqueue writes it."""
    options = dict(
        queue="mail",
        priority="high",
        max_retries=4,
        idempotency_key="invoice-42",
        delay=60.0,
        version=2,
    )
    payload = {"invoice_id": 42, "lines": [1, 2.5, "é"], "nested": {"ok": True}}
    first = await via.enqueue("send-invoice", payload, **options)
    assert first.created is True
    again = await via.enqueue("send-invoice", payload, **{**options, "priority": 3})
    assert again.created is False and again.job.id == first.job.id
    assert again.job == await pgworker.get_job(conn, first.job.id)
    with pytest.raises(IdempotencyConflict):
        await via.enqueue("send-invoice", {"invoice_id": 43}, **options)
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 1

    stored = await row_of(conn, first.job.id)
    assert first.job == await pgworker.get_job(conn, first.job.id)
    await conn.execute("DELETE FROM pgworker.jobs")
    reference = await pgworker.enqueue(conn, "send-invoice", payload, **options)
    expected = await row_of(conn, reference.job.id)
    for column in COMPARED:
        if column == "correlation_id":
            continue
        assert stored[column] == expected[column], column
    assert stored["wait"] == expected["wait"] == timedelta(seconds=60)
    assert stored["max_retries"] == 4 and stored["priority"] == 20


@aio
async def test_null_payloads_and_equal_numbers_are_one_job_on_every_driver(via, conn):
    """A null payload is the {} that asyncpg's enqueue stores, and one key
    with payloads equal as JSON values (1 and 1.0, at any depth) is one job, whichever path
    enqueued it first; a different value still conflicts."""
    ours = await via.enqueue("t", None, idempotency_key="null-theirs")
    assert ours.created is True
    reference = await pgworker.enqueue(conn, "t", None, idempotency_key="null-theirs")
    assert (reference.job.id, reference.created) == (ours.job.id, False)
    python = await pgworker.enqueue(conn, "t", None, idempotency_key="null-ours")
    again = await via.enqueue("t", None, idempotency_key="null-ours")
    assert (again.job.id, again.created) == (python.job.id, False)
    plain = await via.enqueue("t", None)
    rows = await conn.fetch(
        "SELECT payload, fingerprint FROM pgworker.jobs WHERE id = ANY($1::bigint[])",
        [ours.job.id, plain.job.id],
    )
    expected = await row_of(conn, python.job.id)
    assert all(r["payload"] == expected["payload"] == "{}" for r in rows)

    first = await via.enqueue("t", {"a": 1, "n": {"x": [2, 3.5]}}, idempotency_key="numbers")
    for payload in ({"a": 1.0, "n": {"x": [2.0, 3.50]}}, {"n": {"x": [2, 3.5]}, "a": 1}):
        found = await via.enqueue("t", payload, idempotency_key="numbers")
        assert (found.job.id, found.created) == (first.job.id, False)
        python = await pgworker.enqueue(conn, "t", payload, idempotency_key="numbers")
        assert (python.job.id, python.created) == (first.job.id, False)
    with pytest.raises(IdempotencyConflict):
        await via.enqueue("t", {"a": 2, "n": {"x": [2, 3.5]}}, idempotency_key="numbers")
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 4


@aio
async def test_defaults_leave_max_retries_null_and_take_a_correlation_id(via, conn):
    first = await via.enqueue("t", {"a": 1}, correlation_id="req-1")
    plain = await via.enqueue("t", {})
    rows = {r["id"]: r for r in await conn.fetch("SELECT * FROM pgworker.jobs")}
    assert rows[plain.job.id]["max_retries"] is None
    assert rows[plain.job.id]["queue"] == "default" and rows[plain.job.id]["priority"] == 0
    assert rows[plain.job.id]["version"] == 1 and rows[plain.job.id]["fingerprint"] is None
    assert rows[first.job.id]["correlation_id"] == "req-1"


@aio
async def test_a_rollback_leaves_nothing(via, conn):
    await via.enqueue("t", {"n": 1}, idempotency_key="rolled-back", rollback=True)
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 0
    # The key is free again: the job it named never existed.
    again = await via.enqueue("t", {"n": 2}, idempotency_key="rolled-back")
    assert again.created is True


MANY_VIAS = [v for v in VIAS if v is not ViaSQLFunction]


@pytest_asyncio.fixture(loop_scope="session", params=MANY_VIAS, ids=lambda v: v.name)
async def many_via(request: Any, dsn: str) -> AsyncIterator[Via]:
    async with request.param(dsn) as v:
        yield v


@aio
async def test_enqueue_many_is_all_or_nothing_on_every_driver(many_via, conn):
    held = await pgworker.enqueue(conn, "t", {"k": 1}, idempotency_key="held")
    plain = [JobSpec("t", {"n": n}) for n in range(3)]
    results = await many_via.enqueue_many(plain)
    assert [r.created for r in results] == [True] * 3
    assert [r.job.payload for r in results] == [{"n": 0}, {"n": 1}, {"n": 2}]
    mixed = [
        JobSpec("t", {"n": 10}, idempotency_key="fresh", priority="critical"),
        JobSpec("t", {"k": 1}, idempotency_key="held"),
        JobSpec("t", {"n": 10}, idempotency_key="fresh", priority="critical"),
    ]
    results = await many_via.enqueue_many(mixed)
    assert [r.created for r in results] == [True, False, False]
    assert results[1].job.id == held.job.id and results[2].job.id == results[0].job.id
    assert results[0].job.priority == 30
    before = await conn.fetchval("SELECT count(*) FROM pgworker.jobs")
    conflicting = [
        JobSpec("t", {"n": 20}, idempotency_key="new"),
        JobSpec("t", {}, idempotency_key="held"),
    ]
    with pytest.raises(IdempotencyConflict) as caught:
        await many_via.enqueue_many(conflicting)
    assert caught.value.job_id == held.job.id
    with pytest.raises(pgworker.ValidationError) as invalid:
        await many_via.enqueue_many([JobSpec("t"), JobSpec("t", priority="urgent")])
    assert invalid.value.field == "specs[1].priority"
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == before
    await many_via.enqueue_many(plain, rollback=True)
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == before


# A batch whose first job is new and whose second conflicts with the job holding "k".
CONFLICTING = [
    JobSpec("t", {"fresh": 1}, idempotency_key="fresh"),
    JobSpec("t", {"a": 2}, idempotency_key="k"),
]


def sync_usable_after_conflicts(conn: Any, execute: Callable[[str], Any]) -> None:
    """In the caller's open transaction: a write of its own, two conflicts, one more enqueue."""
    execute("INSERT INTO mine VALUES (1)")
    with pytest.raises(IdempotencyConflict):
        pgworker.sync.enqueue_many(conn, CONFLICTING)
    with pytest.raises(IdempotencyConflict):
        pgworker.sync.enqueue(conn, "t", {"a": 2}, idempotency_key="k")
    pgworker.sync.enqueue(conn, "after", {})


@aio
async def test_a_conflict_leaves_the_callers_transaction_usable(dsn, conn):
    """As on asyncpg, IdempotencyConflict rolls back only pgworker's own savepoint: the jobs its
    batch had inserted are gone, the caller's own writes stay and commit."""
    await pgworker.enqueue(conn, "t", {"a": 1}, idempotency_key="k")
    await conn.execute("CREATE TABLE mine (n int)")

    with psycopg.connect(dsn) as pconn:
        sync_usable_after_conflicts(pconn, pconn.execute)
        pconn.commit()
    with psycopg.connect(dsn, autocommit=True) as pconn, pconn.transaction():
        sync_usable_after_conflicts(pconn, pconn.execute)
    engine = create_engine(url(dsn, "postgresql+psycopg"))
    with Session(engine) as session:
        sync_usable_after_conflicts(session, lambda sql: session.execute(text(sql)))
        session.commit()
    engine.dispose()

    def in_atomic() -> None:
        django_database(dsn)
        from django.db import connection, transaction

        with transaction.atomic():
            sync_usable_after_conflicts(connection, lambda sql: connection.cursor().execute(sql))
        connection.close()

    await in_django(in_atomic)
    aconn = await psycopg.AsyncConnection.connect(dsn)
    async with aconn:
        await aconn.execute("INSERT INTO mine VALUES (1)")
        with pytest.raises(IdempotencyConflict):
            await pgworker.enqueue_many(aconn, CONFLICTING)
        await pgworker.enqueue(aconn, "after", {})
        await aconn.commit()
    aengine = create_async_engine(url(dsn, "postgresql+asyncpg"))
    async with AsyncSession(aengine) as asession:
        await asession.execute(text("INSERT INTO mine VALUES (1)"))
        with pytest.raises(IdempotencyConflict):
            await pgworker.enqueue_many(asession, CONFLICTING)
        await pgworker.enqueue(asession, "after", {})
        await asession.commit()
    await aengine.dispose()
    assert await conn.fetchval("SELECT count(*) FROM mine") == 6
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE type = 'after'") == 6
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 6 + 1
    # The first spec of each conflicting batch was inserted, then rolled back with its savepoint.
    assert not await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs WHERE idempotency_key = 'fresh'"
    )


@aio
async def test_the_callers_row_factory_does_not_matter(dsn, conn):
    from psycopg.rows import dict_row, namedtuple_row

    with psycopg.connect(dsn, row_factory=dict_row) as pconn:
        one = pgworker.sync.enqueue(pconn, "t", {"a": 1}, idempotency_key="k")
    aconn = await psycopg.AsyncConnection.connect(dsn, row_factory=namedtuple_row)
    async with aconn:
        again = await pgworker.enqueue(aconn, "t", {"a": 1}, idempotency_key="k")
    assert (one.created, again.created, again.job) == (True, False, one.job)
    assert one.job == await pgworker.get_job(conn, one.job.id)


@aio
async def test_validation_errors_are_those_of_asyncpg(via, conn):
    cases = [
        (("", {}), {}, "type"),
        (("t", {}), {"priority": "urgent"}, "priority"),
        (("t", {}), {"max_retries": -1}, "max_retries"),
        (("t", {}), {"queue": ""}, "queue"),
        (("t", {}), {"delay": -1.0}, "delay"),
        (("t", [[[[1]]]]), {}, None),  # accepted
    ]
    for args, kw, field in cases:
        if field is None:
            await via.enqueue(*args, **kw)
            continue
        with pytest.raises((pgworker.ValidationError, asyncpg.PostgresError)) as caught:
            await via.enqueue(*args, **kw)
        if isinstance(caught.value, pgworker.ValidationError):
            assert caught.value.field == field
        else:  # the SQL function: SQLSTATE 22023, the argument in the error's column
            assert caught.value.sqlstate == "22023" and caught.value.column_name == field
            assert str(caught.value).startswith(f"{field}: ")
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 1


@aio
async def test_the_job_wakes_a_listener_only_when_it_commits(dsn, conn):
    got: list[str] = []
    await conn.add_listener("pgworker_jobs", lambda *args: got.append(args[3]))
    with psycopg.connect(dsn) as pconn:
        pgworker.sync.enqueue(pconn, "t", {}, queue="rolled")
        pconn.rollback()
        pgworker.sync.enqueue(pconn, "t", {}, queue="committed")
        pconn.commit()
    await wait_for(lambda: got)
    await conn.execute("SELECT 1")  # a round trip: any other notification has arrived too
    assert [json.loads(p)["queue"] for p in got] == ["committed"]


# --- what is refused --------------------------------------------------------------------------


@aio
async def test_anything_else_is_a_type_error_naming_what_is_accepted(dsn):
    with pytest.raises(TypeError, match="asyncpg Connection or Pool, a psycopg AsyncConnection"):
        await pgworker.enqueue(object(), "t", {})
    with pytest.raises(TypeError, match="asyncpg Connection or Pool"):
        await pgworker.enqueue_many(object(), [JobSpec("t")])
    with pytest.raises(TypeError, match="psycopg Connection, a SQLAlchemy Connection or Session"):
        pgworker.sync.enqueue("postgresql://x/y", "t", {})
    sync_only = r"synchronous connection: use pgworker\.sync\.enqueue"
    with psycopg.connect(dsn) as pconn, pytest.raises(TypeError, match=sync_only):
        await pgworker.enqueue(pconn, "t", {})
    aconn = await psycopg.AsyncConnection.connect(dsn)
    try:
        with pytest.raises(TypeError, match=r"asynchronous connection: use `await pgworker"):
            pgworker.sync.enqueue(aconn, "t", {})
    finally:
        await aconn.close()
    engine = create_engine("sqlite://")
    with engine.connect() as sconn, pytest.raises(TypeError, match="on PostgreSQL, not sqlite"):
        pgworker.sync.enqueue(sconn, "t", {})


@aio
async def test_a_closed_connection_is_a_clear_error(dsn, conn):
    pconn = psycopg.connect(dsn)
    pconn.close()
    with pytest.raises(pgworker.DatabaseUnavailable, match="psycopg Connection is closed"):
        pgworker.sync.enqueue(pconn, "t", {})
    aconn = await psycopg.AsyncConnection.connect(dsn)
    await aconn.close()
    with pytest.raises(pgworker.DatabaseUnavailable, match="AsyncConnection is closed; reconnect"):
        await pgworker.enqueue(aconn, "t", {})
    # asyncpg's own closed connection: the same error (tests/test_enqueue.py says more).
    nconn = await asyncpg.connect(dsn)
    await nconn.close()
    with pytest.raises(pgworker.DatabaseUnavailable, match="asyncpg Connection is closed"):
        await pgworker.enqueue(nconn, "t", {})
    engine = create_engine(url(dsn, "postgresql+psycopg"))
    sconn = engine.connect()
    sconn.close()
    with pytest.raises(pgworker.DatabaseUnavailable, match="SQLAlchemy Connection is closed"):
        pgworker.sync.enqueue(sconn, "t", {})
    engine.dispose()
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 0


@aio
async def test_an_aborted_transaction_is_a_clear_error(dsn, conn):
    aborted = "transaction is aborted .* roll it back, then enqueue: nothing was written"
    with psycopg.connect(dsn) as pconn:
        with pytest.raises(psycopg.errors.UndefinedTable):
            pconn.execute("SELECT * FROM no_such_table")
        with pytest.raises(pgworker.PgWorkerError, match=aborted):
            pgworker.sync.enqueue(pconn, "t", {})
        with pytest.raises(pgworker.PgWorkerError, match=aborted):
            pgworker.sync.enqueue_many(pconn, [JobSpec("t", idempotency_key="k")])
    aconn = await psycopg.AsyncConnection.connect(dsn)
    try:
        with pytest.raises(psycopg.errors.UndefinedTable):
            await aconn.execute("SELECT * FROM no_such_table")
        with pytest.raises(pgworker.PgWorkerError, match=aborted):
            await pgworker.enqueue(aconn, "t", {})
    finally:
        await aconn.close()
    # asyncpg's own aborted transaction: the same error (tests/test_enqueue.py says more).
    async with conn.transaction():
        with pytest.raises(asyncpg.UndefinedTableError):
            await conn.execute("SELECT * FROM no_such_table")
        with pytest.raises(pgworker.PgWorkerError, match=aborted):
            await pgworker.enqueue(conn, "t", {})
    # (leaving the block commits an aborted transaction, which PostgreSQL rolls back)
    engine = create_engine(url(dsn, "postgresql+psycopg"))
    with Session(engine) as session:
        with pytest.raises(Exception, match="no_such_table"):
            session.execute(text("SELECT * FROM no_such_table"))
        with pytest.raises(pgworker.PgWorkerError, match=aborted):
            pgworker.sync.enqueue(session, "t", {})
    engine.dispose()

    def in_an_aborted_atomic_block() -> None:
        django_database(dsn)
        from django.db import DatabaseError, connection, transaction

        with pytest.raises(pgworker.PgWorkerError, match=aborted), transaction.atomic():
            with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
                cursor.execute("SELECT * FROM no_such_table")
            pgworker.sync.enqueue(connection, "t", {})
        connection.close()

    await in_django(in_an_aborted_atomic_block)
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 0


@aio
async def test_a_missing_schema_is_a_schema_error(empty_dsn):
    with (
        psycopg.connect(empty_dsn) as pconn,
        pytest.raises(pgworker.SchemaError, match="run `pgworker migrate`"),
    ):
        pgworker.sync.enqueue(pconn, "t", {})


def test_import_pgworker_imports_no_driver_but_asyncpg():
    program = (
        "import sys, pgworker, pgworker.sync\n"
        "found = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'psycopg', 'sqlalchemy', 'django'})\n"
        "print(found)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- the Django example -----------------------------------------------------------------------


@aio
async def test_the_django_example_view_enqueues_in_its_transaction(dsn, conn):
    await in_django(django_database, dsn)
    from django.test import Client

    client = Client()
    response = await in_django(client.post, "/invoices/42/send")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["created"] is True
    job = await pgworker.get_job(conn, body["job_id"])
    assert job is not None and job.payload == {"invoice_id": 42}
    assert job.idempotency_key == "invoice-42-send"
    again = (await in_django(client.post, "/invoices/42/send")).json()
    assert again == {"job_id": body["job_id"], "created": False}

    def in_a_transaction_rolled_back() -> None:
        from django.db import transaction
        from django.test import RequestFactory

        from examples.django_app.views import send_invoice

        with contextlib.suppress(Rollback), transaction.atomic():
            assert send_invoice(RequestFactory().post("/invoices/7/send"), 7).status_code == 202
            raise Rollback

    await in_django(in_a_transaction_rolled_back)
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 1

    def by_alias() -> int:
        from django.db import connections

        return pgworker.sync.enqueue(connections["default"], "by-alias", {}).job.id

    by_alias_id = await in_django(by_alias)
    assert (await pgworker.get_job(conn, by_alias_id)).type == "by-alias"
    await conn.execute("DELETE FROM pgworker.jobs WHERE id = $1", by_alias_id)
    await in_django(close_django)

    # The worker of the example runs the job, with Django set up in its handlers module.
    env = {k: v for k, v in os.environ.items() if k not in ("PGWORKER_DSN", "DATABASE_URL")}
    env.update(PYTHONPATH=str(ROOT), PGWORKER_DSN=dsn)
    migrated = subprocess.run(
        [*MANAGE, "pgworker", "migrate"], env=env, cwd=ROOT, capture_output=True, timeout=120
    )
    assert migrated.returncode == 0, migrated.stderr.decode()
    worker = subprocess.Popen(
        [*MANAGE, "pgworker", "run", "examples.django_app.handlers"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'completed' FROM pgworker.jobs WHERE id = $1", body["job_id"]
            ),
            timeout=60,
        )
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err.decode()
    job = await pgworker.get_job(conn, body["job_id"])
    assert job.result == {"sent": 42}
    assert job.finished_at is not None and job.finished_at <= datetime.now(UTC)


def test_doc_blocks_naming_an_example_are_its_code():
    """A block of the README or the site whose first line names a file of examples/django_app
    is that file's text, verbatim."""
    import re

    from .docs import all_blocks

    checked = 0
    for block in all_blocks():
        named = re.fullmatch(r"# (examples/django_app/\S+)", block.first_line)
        if named is not None:
            assert block.rest.strip() in (ROOT / named[1]).read_text(), f"{block}: {named[1]}"
            checked += 1
    assert checked >= 2
