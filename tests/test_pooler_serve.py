"""`pgworker serve --pooler` through a real PgBouncer in transaction mode (tests/pgbouncer.py)
with one server session for every client: two serve processes answer every route, many requests
at once, and leave nothing on the session that the next client would meet (a named statement,
a portal, a setting)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest

import pgworker

from .pgbouncer import PgBouncer, available
from .webserver import Served, serving

pytestmark = [
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.skipif(
        not available(), reason="needs PgBouncer (/usr/sbin/pgbouncer; apt-get install pgbouncer)"
    ),
]


@pytest.fixture
def narrow(server_dsn: str) -> Iterator[PgBouncer]:
    """One server session for every client: what one client leaves there, the next one meets."""
    with PgBouncer(server_dsn, pool_size=1) as b:
        yield b


async def left_on_the_session(through: str) -> dict[str, Any]:
    """What the one server session behind `narrow` holds that a client could have left there."""
    conn = await asyncpg.connect(through, statement_cache_size=0)
    try:
        row = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM pg_prepared_statements) AS statements, "
            "(SELECT count(*) FROM pg_cursors WHERE name <> '') AS cursors, "
            "current_setting('lock_timeout') AS lock_timeout, "
            "current_setting('statement_timeout') AS statement_timeout"
        )
        assert row is not None
        return dict(row)
    finally:
        await conn.close()


CLEAN = {"statements": 0, "cursors": 0, "lock_timeout": "0", "statement_timeout": "0"}


def ok(response: httpx.Response) -> httpx.Response:
    assert response.status_code < 300, (response.request.url, response.status_code, response.text)
    return response


async def test_two_serve_processes_answer_every_route_through_the_pooler(dsn, conn, narrow):
    """GET /jobs read a cursor, whose statement asyncpg prepares by name: it stayed on the
    server session, and the other process's first list met it (DuplicatePreparedStatementError,
    answered 503)."""
    through = narrow.dsn(dsn)
    ids = [(await pgworker.enqueue(conn, "echo", {"n": n})).job.id for n in range(5)]
    args = ("--pooler", "--insecure-no-auth")
    async with (
        serving(through, *args, token=None) as a,
        serving(through, *args, token=None) as b,
        a.client() as ca,
        b.client() as cb,
    ):
        for c in (ca, cb, ca, cb):  # one after the other: each meets what the last one left
            assert [j["id"] for j in ok(await c.get("/jobs")).json()["jobs"]] == ids[::-1]
        for _ in range(3):
            answers = await asyncio.gather(
                *(request(c, ids[0]) for c in (ca, cb) for _ in range(4))
            )
            for answer in answers:
                for response in answer:
                    ok(response)
        assert await left_on_the_session(through) == CLEAN
        logs = a.stderr() + b.stderr()
    assert "request failed" not in logs, logs[-3000:]


async def request(c: httpx.AsyncClient, job: int) -> list[httpx.Response]:
    """One of each route that reads or writes the database, the dashboard's pages included."""
    made = ok(await c.post("/jobs", json={"type": "echo", "payload": {"by": "http"}})).json()
    responses = [
        await c.get("/jobs"),
        await c.get("/jobs", params={"limit": 2, "status": "pending", "type": "echo"}),
        await c.get(f"/jobs/{job}"),
        await c.get("/queues"),
        await c.get("/workers"),
        await c.post(f"/jobs/{made['id']}/cancel"),
        await c.post(f"/jobs/{made['id']}/replay", json={"reason": "through the pooler"}),
        await c.get("/"),
        await c.get("/ui/jobs"),
        await c.get(f"/ui/jobs/{job}"),
        await c.get("/ui/workers"),
    ]
    claimed = await c.post("/jobs/claim", json={"worker_id": "http-1", "types": ["echo"]})
    responses.append(claimed)
    if claimed.status_code == 200:
        held = {"worker_id": "http-1", "attempt": claimed.json()["attempt"]}
        job_id = claimed.json()["id"]
        responses.append(await c.post(f"/jobs/{job_id}/heartbeat", json=held))
        responses.append(await c.post(f"/jobs/{job_id}/complete", json=held))
    return responses


async def test_serve_pages_jobs_through_the_pooler_as_it_does_directly(dsn, conn, narrow):
    """The list in pooler mode keeps what the cursor gave: newest first, the filters, the
    `before` keyset, `limit`, and the cut at about 8 MB of JSON (read one row at a time)."""
    big = "x" * (3 * 1024 * 1024)
    kinds = ["echo", "sleep", "echo", "echo", "sleep", "echo", "echo"]
    ids = [(await pgworker.enqueue(conn, t, {"n": n})).job.id for n, t in enumerate(kinds)]
    heavy = [(await pgworker.enqueue(conn, "big", {"blob": big})).job.id for _ in range(3)]
    echoes = [i for i, t in zip(ids, kinds, strict=True) if t == "echo"][::-1]
    direct: Served
    async with (
        serving(narrow.dsn(dsn), "--pooler") as pooled,
        serving(dsn) as direct,
        pooled.client() as p,
        direct.client() as d,
    ):
        for c in (p, d):
            page = ok(await c.get("/jobs")).json()
            assert [j["id"] for j in page["jobs"]] == heavy[::-1][:2], "cut at 8 MB"
            assert page["next_before"] == heavy[1]
            seen, before = [], None
            while True:
                params: dict[str, Any] = {"type": "echo", "limit": 2}
                if before is not None:
                    params["before"] = before
                page = ok(await c.get("/jobs", params=params)).json()
                seen += [j["id"] for j in page["jobs"]]
                before = page["next_before"]
                if before is None:
                    break
            assert seen == echoes
            none = ok(await c.get("/jobs", params={"status": "failed"})).json()
            assert none == {"jobs": [], "next_before": None}
    assert re.fullmatch(r"\d+", str(heavy[0]))
