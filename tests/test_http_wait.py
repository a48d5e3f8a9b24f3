"""GET /jobs/{id}?wait=SECONDS, against a real `pgworker serve`: the long poll
answers 200 with the job as soon as it ends (`Pgworker-Wait: ended`), or 200 with the job as it is
when the wait ran out (`Pgworker-Wait: timeout`, the job unchanged); a bad `wait` is 422 naming it,
an unknown job 404 at once; long polls hold no connection of the server's pool (more of them than
the pool has connections leave plain reads prompt) and share one waiter connection; a client that
leaves ends its wait."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import httpx
import pytest

import pgworker
from pgworker._web.api import POOL_SIZE

from .helpers import wait_for
from .webserver import Served, server

pytestmark = pytest.mark.asyncio(loop_scope="session")

__all__ = ["server"]  # the fixture, used by name


async def awaited(conn: Any, n: int) -> bool:
    return bool(await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE awaited") == n)


async def waiters(conn: Any) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgworker-wait:%' "
            "AND datname = current_database()"
        )
    )


async def test_the_long_poll_answers_when_the_job_ends(
    server: Served, conn: asyncpg.Connection
) -> None:
    job = (await pgworker.enqueue(conn, "echo", {"x": 1})).job
    async with server.client(timeout=30) as c:
        polling = asyncio.create_task(c.get(f"/jobs/{job.id}", params={"wait": "20"}))
        await wait_for(lambda: awaited(conn, 1))
        claimed = (await c.post("/jobs/claim", json={"worker_id": "go-1"})).json()
        assert claimed["id"] == job.id
        done = await c.post(
            f"/jobs/{job.id}/complete", json={"worker_id": "go-1", "attempt": 1, "result": 42}
        )
        assert done.status_code == 200
        completed = time.monotonic()
        r = await polling
        assert time.monotonic() - completed < 1.5
    assert r.status_code == 200
    assert r.headers["Pgworker-Wait"] == "ended"
    assert r.json()["status"] == "completed" and r.json()["result"] == 42
    assert [a["outcome"] for a in r.json()["attempt_history"]] == ["completed"]


async def test_the_long_poll_answers_the_current_job_when_the_wait_runs_out(
    server: Served, conn: asyncpg.Connection
) -> None:
    job = (await pgworker.enqueue(conn, "echo", {"x": 1})).job
    async with server.client(timeout=30) as c:
        before = (await c.get(f"/jobs/{job.id}")).json()
        assert "Pgworker-Wait" not in (await c.get(f"/jobs/{job.id}")).headers
        started = time.monotonic()
        r = await c.get(f"/jobs/{job.id}", params={"wait": "0.5"})
        assert 0.5 <= time.monotonic() - started < 5
    assert r.status_code == 200
    assert r.headers["Pgworker-Wait"] == "timeout"
    assert r.json() == before  # pending, unchanged


@pytest.mark.parametrize("wait", ["0", "-1", "60.5", "61", "abc", "nan", "inf", "1e999", ""])
async def test_a_bad_wait_is_422_naming_it(
    server: Served, conn: asyncpg.Connection, wait: str
) -> None:
    job = (await pgworker.enqueue(conn, "echo")).job
    async with server.client() as c:
        r = await c.get(f"/jobs/{job.id}", params={"wait": wait})
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "wait"
    assert not await conn.fetchval("SELECT awaited FROM pgworker.jobs WHERE id = $1", job.id)


async def test_an_unknown_job_is_404_at_once(server: Served) -> None:
    async with server.client() as c:
        started = time.monotonic()
        r = await c.get("/jobs/999999", params={"wait": "30"})
        assert time.monotonic() - started < 1.5
    assert r.status_code == 404


async def test_long_polls_hold_no_connection_of_the_pool(
    server: Served, conn: asyncpg.Connection
) -> None:
    n = POOL_SIZE * 2
    jobs = [(await pgworker.enqueue(conn, "echo", {"i": i})).job for i in range(n)]
    async with server.client(timeout=30) as c:
        polls = [asyncio.create_task(c.get(f"/jobs/{j.id}", params={"wait": "20"})) for j in jobs]
        await wait_for(lambda: awaited(conn, n))
        started = time.monotonic()
        assert (await c.get(f"/jobs/{jobs[0].id}")).status_code == 200
        assert time.monotonic() - started < 1.0
        assert await waiters(conn) == 1
        for j in jobs:
            await pgworker.cancel(conn, j.id)
        answers = await asyncio.gather(*polls)
    assert {r.headers["Pgworker-Wait"] for r in answers} == {"ended"}
    assert {r.json()["status"] for r in answers} == {"cancelled"}


async def test_a_client_that_leaves_ends_its_wait(server: Served, conn: asyncpg.Connection) -> None:
    """Its wait gone, the waiter closes its connection once idle (5 s), not after 60 s."""
    job = (await pgworker.enqueue(conn, "echo")).job
    async with server.client(timeout=0.5) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.get(f"/jobs/{job.id}", params={"wait": "60"})
    assert await waiters(conn) == 1
    await wait_for(lambda: _none(conn), timeout=15)


async def _none(conn: Any) -> bool:
    return await waiters(conn) == 0
