"""The test database, in this order (README, Two commands): PGWORKER_TEST_DSN; else a
testcontainers PostgreSQL when a Docker engine answers; else a throwaway cluster from local
PostgreSQL binaries (or the embedded package). A template database is migrated once per test
process; the tests' databases are made from it and reset between tests (tests/dbpool.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
import pytest_asyncio

import pgworker
from examples import devdb

from .dbpool import DatabasePool, with_database


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    if os.environ.get("PGWORKER_TEST_DSN"):
        yield os.environ["PGWORKER_TEST_DSN"]
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:15", driver=None) as pg:
            yield pg.get_connection_url()
        return
    data = tempfile.mkdtemp(prefix="pgw-test-")
    # On TCP as well as its socket: a PgBouncer the tests start runs as another user, who
    # cannot reach the socket's directory.
    port = _free_port()
    cluster = devdb.Cluster(data, bindir=devdb.local_bindir(), fsync=False, port=port)
    try:
        yield cluster.start()
    finally:
        cluster.stop("immediate")
        shutil.rmtree(data, ignore_errors=True)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def template_db(server_dsn: str) -> AsyncIterator[str]:
    """A migrated database that every test database is made from: one per test process (each
    pytest-xdist worker has its own, under a name of its own)."""
    name = f"pgworker_tpl_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    conn = await asyncpg.connect(with_database(server_dsn, name))
    await pgworker.migrate(conn)
    await conn.close()
    try:
        yield name
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def database_pool(server_dsn: str, template_db: str) -> AsyncIterator[DatabasePool]:
    pool = DatabasePool(server_dsn, template_db)
    try:
        yield pool
    finally:
        await pool.close()


@contextlib.asynccontextmanager
async def scratch_database(server_dsn: str, name: str, template: str | None = None):
    """A database made for one test and dropped after it, whatever its connections."""
    admin = await asyncpg.connect(server_dsn)
    like = f' TEMPLATE "{template}"' if template else ""
    await admin.execute(f'CREATE DATABASE "{name}"{like}')
    try:
        yield with_database(server_dsn, name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest_asyncio.fixture(loop_scope="session")
async def dsn(
    request: pytest.FixtureRequest, server_dsn: str, database_pool: DatabasePool
) -> AsyncIterator[str]:
    """A migrated database that looks new to this test: one of the pool's, reset after the test
    (tests/dbpool.py); a test marked `fresh_db` (it changes the schema) gets one of its own."""
    if request.node.get_closest_marker("fresh_db"):
        async with database_pool.fresh() as name:
            yield with_database(server_dsn, name)
        return
    name = await database_pool.acquire()
    yield with_database(server_dsn, name)
    why = await database_pool.release(name)
    if why is not None:
        warnings.warn(
            f"{request.node.nodeid} left its database unlike a new one ({why}); it was "
            "dropped and made again: mark the test fresh_db",
            stacklevel=1,
        )


@pytest_asyncio.fixture(loop_scope="session")
async def empty_dsn(server_dsn: str) -> AsyncIterator[str]:
    """A database without the pgworker schema."""
    async with scratch_database(server_dsn, f"pgworker_empty_{uuid.uuid4().hex[:8]}") as d:
        yield d


@pytest_asyncio.fixture(loop_scope="session")
async def conn(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    try:
        yield c
    finally:
        with contextlib.suppress(Exception):
            await c.close()


@pytest_asyncio.fixture(loop_scope="session")
async def pool(dsn: str) -> AsyncIterator[asyncpg.Pool]:
    p = await asyncpg.create_pool(dsn, min_size=1, max_size=60)
    try:
        yield p
    finally:
        await p.close()
