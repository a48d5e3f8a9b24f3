"""The PostgreSQL majors pgworker supports (docs/operations/versions.md): `migrate` refuses a
server older than the oldest one `make test-matrix` runs, naming both versions, before it writes
anything."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import asyncpg
import pytest

import pgworker
from pgworker import cli
from pgworker._db import migrations

from .matrix import SERVERS

ROOT = Path(__file__).resolve().parent.parent
aio = pytest.mark.asyncio(loop_scope="session")


async def _server(conn: asyncpg.Connection) -> tuple[str, int]:
    shown = await conn.fetchval("SHOW server_version")
    return shown, int(await conn.fetchval("SHOW server_version_num")) // 10000


async def _nothing_created(conn: asyncpg.Connection) -> None:
    assert await conn.fetchval("SELECT to_regnamespace('pgworker')") is None


@aio
async def test_migrate_refuses_a_server_older_than_the_oldest_supported(empty_dsn, monkeypatch):
    conn = await asyncpg.connect(empty_dsn)
    try:
        shown, major = await _server(conn)
        monkeypatch.setattr(migrations, "MIN_SERVER_MAJOR", major + 1)
        with pytest.raises(pgworker.SchemaError) as refused:
            await pgworker.migrate(conn)
        message = str(refused.value)
        assert f"PostgreSQL {shown} is older" in message
        assert f"needs PostgreSQL {major + 1} or newer" in message
        await _nothing_created(conn)
        pool = await asyncpg.create_pool(empty_dsn, min_size=1, max_size=1)
        try:
            with pytest.raises(pgworker.SchemaError, match=re.escape(shown)):
                await pgworker.migrate(pool, schema="jobs")
        finally:
            await pool.close()
        assert await conn.fetchval("SELECT to_regnamespace('jobs')") is None
    finally:
        await conn.close()


@aio
async def test_migrate_takes_the_oldest_supported_major_itself(empty_dsn, monkeypatch):
    conn = await asyncpg.connect(empty_dsn)
    try:
        _, major = await _server(conn)
        monkeypatch.setattr(migrations, "MIN_SERVER_MAJOR", major)
        assert await pgworker.migrate(conn)
    finally:
        await conn.close()


@aio
async def test_the_cli_says_what_the_server_lacks_and_exits_2(empty_dsn, monkeypatch, capsys):
    conn = await asyncpg.connect(empty_dsn)
    try:
        shown, major = await _server(conn)
        monkeypatch.setattr(migrations, "MIN_SERVER_MAJOR", major + 1)
        code = await anyio.to_thread.run_sync(cli.main, ["migrate", "--dsn", empty_dsn])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.startswith(f"pgworker migrate: error: PostgreSQL {shown} is older"), err
        assert f"needs PostgreSQL {major + 1} or newer" in err
        await _nothing_created(conn)
    finally:
        await conn.close()


def test_the_supported_majors_are_the_ones_the_matrix_runs():
    majors = [s.major for s in SERVERS]
    assert majors == sorted(majors)
    assert majors[0] == migrations.MIN_SERVER_MAJOR
    page = (ROOT / "docs" / "operations" / "versions.md").read_text()
    stated = re.search(r"PostgreSQL majors?: (.+)", page)
    assert stated is not None, "docs/operations/versions.md states the supported majors"
    assert [int(m) for m in re.findall(r"\d+", stated.group(1))] == majors
    readme = re.search(
        r"\*\*Supported PostgreSQL\*\*: (.+?), each tested", (ROOT / "README.md").read_text()
    )
    assert readme is not None, "the README states the supported majors"
    assert [int(m) for m in re.findall(r"\d+", readme.group(1))] == majors
