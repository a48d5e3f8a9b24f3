"""Every enqueue path whose connection PostgreSQL ends mid-statement (what a server shutdown does
to each session: FATAL 57P01, then the socket closed) raises DatabaseUnavailable, whatever the
driver, the path (one job, COPY, the batch INSERT) or where the loss surfaces (in the statement,
in a pool's connection, in the rollback after it)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import psycopg
import pytest

import pgworker
from pgworker import sync

from .helpers import PgProxy

pytestmark = pytest.mark.asyncio(loop_scope="session")

VICTIM = f"pgworker-victim-{os.getpid()}"
"""The session to end: named after this test process, since pg_stat_activity shows every
database's sessions and other pytest-xdist processes run these tests too."""


class _StallAt(PgProxy):
    """The proxy, stalled when a client sends its first message of kind `at` (b"d": COPY's data,
    b"B": a statement's execution), that message not yet forwarded: the server waits for it."""

    def __init__(self, dsn: str, at: bytes) -> None:
        super().__init__(dsn)
        self.at: bytes | None = at
        self.stalled = asyncio.Event()

    def _watch(self, link: Any, kind: bytes, body: bytes) -> None:
        if kind == self.at and link.application_name == VICTIM:
            self.at = None
            self.stall()
            self.stalled.set()
        super()._watch(link, kind, body)


async def _shut_down_mid_statement(
    conn: asyncpg.Connection, proxy: _StallAt, enqueue: Callable[[], Awaitable[Any]]
) -> BaseException:
    """Run `enqueue`; once its statement is on the wire, end the session as a server shutdown
    does (pg_terminate_backend: FATAL 57P01), then let the bytes flow. What it raised."""

    async def shut_down() -> None:
        await proxy.stalled.wait()
        try:
            ended = await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = $1 AND datname = current_database()",
                VICTIM,
            )
            assert ended == 1
        finally:  # whatever happened, the stalled client is not left waiting for ever
            proxy.resume()

    async with asyncio.timeout(30):
        killer = asyncio.create_task(shut_down())
        try:
            await enqueue()
        except Exception as exc:
            raised: BaseException = exc
        else:
            raise AssertionError("the enqueue returned though its session was ended")
        await killer
    return raised


def _specs(n: int, **options: Any) -> list[pgworker.JobSpec]:
    return [pgworker.JobSpec("t", {"i": i}, **options) for i in range(n)]


ASYNC_PATHS: dict[str, tuple[bytes, Callable[[Any], Awaitable[Any]]]] = {
    "enqueue": (b"B", lambda c: pgworker.enqueue(c, "t", {"n": 1})),
    "enqueue_many COPY": (b"d", lambda c: pgworker.enqueue_many(c, _specs(1200))),
    "enqueue_many INSERT": (b"B", lambda c: pgworker.enqueue_many(c, _specs(20, delay=5))),
    "enqueue after=": (b"B", lambda c: pgworker.enqueue(c, "t", {}, after=[1])),
    "enqueue unique_key": (b"B", lambda c: pgworker.enqueue(c, "t", {}, unique_key="k")),
}


@pytest.mark.parametrize("kind", ["connection", "pool"])
@pytest.mark.parametrize("path", list(ASYNC_PATHS))
async def test_asyncpg_enqueue_paths_raise_database_unavailable(
    dsn: str, conn: asyncpg.Connection, kind: str, path: str
) -> None:
    at, enqueue = ASYNC_PATHS[path]
    if path == "enqueue after=":
        await pgworker.enqueue(conn, "t", {})  # job 1, the parent
    async with _StallAt(dsn, at) as proxy:
        settings = {"application_name": VICTIM}
        target: Any
        if kind == "pool":
            target = await asyncpg.create_pool(
                proxy.dsn, min_size=0, max_size=1, server_settings=settings
            )
        else:
            target = await asyncpg.connect(proxy.dsn, server_settings=settings)
        try:
            raised = await _shut_down_mid_statement(conn, proxy, lambda: enqueue(target))
        finally:
            target.terminate()
    assert isinstance(raised, pgworker.DatabaseUnavailable), repr(raised)
    if path.startswith("enqueue_many"):  # its transaction ended with the session: none written
        assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE type = 't'") == (
            1 if path == "enqueue after=" else 0
        )


SYNC_PATHS: dict[str, Callable[[Any], Any]] = {
    "sync.enqueue": lambda c: sync.enqueue(c, "t", {"n": 1}),
    "sync.enqueue_many": lambda c: sync.enqueue_many(c, _specs(20)),
    "sync.enqueue_many scheduled": lambda c: sync.enqueue_many(c, _specs(20, delay=5)),
}


@pytest.mark.parametrize("path", list(SYNC_PATHS))
async def test_sync_enqueue_paths_raise_database_unavailable(
    dsn: str, conn: asyncpg.Connection, path: str
) -> None:
    enqueue = SYNC_PATHS[path]
    async with _StallAt(dsn, b"B") as proxy:
        target = await asyncio.to_thread(
            psycopg.connect, proxy.dsn, autocommit=True, application_name=VICTIM
        )
        try:
            raised = await _shut_down_mid_statement(
                conn, proxy, lambda: asyncio.to_thread(enqueue, target)
            )
        finally:
            target.close()
    assert isinstance(raised, pgworker.DatabaseUnavailable), repr(raised)


async def test_an_async_psycopg_connection_raises_database_unavailable(
    dsn: str, conn: asyncpg.Connection
) -> None:
    async with _StallAt(dsn, b"B") as proxy:
        target = await psycopg.AsyncConnection.connect(
            proxy.dsn, autocommit=True, application_name=VICTIM
        )
        try:
            raised = await _shut_down_mid_statement(
                conn, proxy, lambda: pgworker.enqueue_many(target, _specs(20))
            )
        finally:
            await target.close()
    assert isinstance(raised, pgworker.DatabaseUnavailable), repr(raised)


async def test_a_statement_the_server_cancels_is_not_a_lost_connection(
    dsn: str, conn: asyncpg.Connection
) -> None:
    """Only a lost session is DatabaseUnavailable: a statement cancelled by its timeout, on a
    connection that stays open, is raised as the driver's error."""
    other = await asyncpg.connect(dsn, server_settings={"statement_timeout": "50"})
    try:
        async with conn.transaction():
            await conn.execute("LOCK TABLE pgworker.jobs IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(asyncpg.exceptions.QueryCanceledError):
                await pgworker.enqueue(other, "t", {})
    finally:
        await other.close()


async def test_a_pool_whose_server_cannot_be_reached_raises_database_unavailable(
    dsn: str,
) -> None:
    async with PgProxy(dsn) as proxy:
        gone = proxy.dsn
    pool = await asyncpg.create_pool(gone, min_size=0, max_size=1)
    try:
        for enqueue in (
            lambda: pgworker.enqueue(pool, "t", {}),
            lambda: pgworker.enqueue_many(pool, _specs(3)),
        ):
            with pytest.raises(pgworker.DatabaseUnavailable):
                await enqueue()
    finally:
        pool.terminate()


async def test_a_sqlalchemy_connection_raises_database_unavailable(
    dsn: str, conn: asyncpg.Connection
) -> None:
    import sqlalchemy

    async with _StallAt(dsn, b"") as proxy:  # armed once connected: connecting runs statements
        url = proxy.dsn.replace("postgresql://", "postgresql+psycopg://", 1)
        engine = sqlalchemy.create_engine(
            url, connect_args={"application_name": VICTIM}, poolclass=sqlalchemy.pool.NullPool
        )
        target = await asyncio.to_thread(engine.connect)
        proxy.at = b"B"
        try:
            raised = await _shut_down_mid_statement(
                conn, proxy, lambda: asyncio.to_thread(sync.enqueue, target, "t", {})
            )
        finally:
            await asyncio.to_thread(target.close)
            engine.dispose()
    assert isinstance(raised, pgworker.DatabaseUnavailable), repr(raised)
