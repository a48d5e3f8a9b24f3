"""The dashboard mounted in a user's FastAPI application: under a real uvicorn,
every link, redirect, form, cookie and static file stays under the prefix; a pool passed in is
used and left open; a DSN opens a pool at the first request (no lifespan runs for a mount)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator

import anyio
import asyncpg
import httpx
import pytest

import pgworker
from pgworker.errors import ConfigError
from pgworker.web import Operator, create_app

from .test_dashboard import csrf_of
from .webserver import ROOT, free_port

pytestmark = pytest.mark.asyncio(loop_scope="session")

PREFIX = "/admin/jobs"
TOKEN = "alice-token-0123456789"
LINK = re.compile(r'(?:href|action|src)="([^"]*)"')


@contextlib.contextmanager
def uvicorn(dsn: str) -> Iterator[str]:
    """tests/apps/mounted.py under uvicorn on 127.0.0.1 and a free port; its base URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.apps.mounted:app", "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PGWORKER_TEST_APP_DSN": dsn},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def ready(url: str) -> None:
    deadline = time.monotonic() + 30
    async with httpx.AsyncClient(base_url=url) as client:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/")).status_code == 200:
                    return
            assert time.monotonic() < deadline, "uvicorn did not start"
            await anyio.sleep(0.05)


def links(html: str) -> list[str]:
    return [link for link in LINK.findall(html) if not link.startswith(("?", "#"))]


async def test_mounted_under_a_prefix_in_a_users_app_under_uvicorn(dsn, conn):
    failed = await pgworker.enqueue(conn, "t", {}, queue="mail")
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'failed', finished_at = now() WHERE id = $1",
        failed.job.id,
    )
    with uvicorn(dsn) as url:
        await ready(url)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            assert (await client.get("/")).json() == {"app": "the user's own"}
            first = await client.get(f"{PREFIX}/")
            assert first.status_code == 303
            assert first.headers["location"] == f"{PREFIX}/ui/login?next=%2Fadmin%2Fjobs%2F"
            form = await client.get(first.headers["location"])
            assert "Path=/admin/jobs" in form.headers["set-cookie"]
            assert all(link.startswith(PREFIX) for link in links(form.text)), links(form.text)
            login = await client.post(
                f"{PREFIX}/ui/login",
                data={"csrf": csrf_of(form.text), "token": TOKEN, "next": f"{PREFIX}/"},
            )
            assert login.status_code == 303 and login.headers["location"] == f"{PREFIX}/"
            page = await client.get(f"{PREFIX}/")
            assert page.status_code == 200 and "mail" in page.text
            found = links(page.text)
            assert found and all(link.startswith(PREFIX) for link in found), found
            css = await client.get(f"{PREFIX}/ui/static/dashboard.css")
            assert css.status_code == 200
            # a button: pause, then back to the queues page under the prefix
            pressed = await client.post(
                f"{PREFIX}/ui/queues/pause", data={"csrf": csrf_of(page.text), "queue": "mail"}
            )
            assert pressed.status_code == 303 and pressed.headers["location"] == f"{PREFIX}/"
            assert "Queue mail is paused" in (await client.get(f"{PREFIX}/")).text
            job = await client.get(f"{PREFIX}/ui/jobs/{failed.job.id}")
            replay = await client.post(
                f"{PREFIX}/ui/jobs/{failed.job.id}/replay", data={"csrf": csrf_of(job.text)}
            )
            assert replay.headers["location"] == f"{PREFIX}/ui/jobs/{failed.job.id}"
            log = (await client.get(f"{PREFIX}/ui/log")).text
            assert all(link.startswith(PREFIX) for link in links(log))
            assert f'href="{PREFIX}/ui/jobs/{failed.job.id}"' in log
            # the console's pages and the bulk actions' steps: every link under the prefix
            for path in ("/ui/jobs?status=failed", "/ui/queues/mail", "/ui/workers"):
                shown = await client.get(f"{PREFIX}{path}")
                assert shown.status_code == 200, path
                assert all(link.startswith(PREFIX) for link in links(shown.text)), path
            confirm = await client.get(f"{PREFIX}/ui/jobs/actions/new?kind=cancel&queue=mail")
            assert all(link.startswith(PREFIX) for link in links(confirm.text))
            fields = dict(re.findall(r'name="([a-z_]+)" value="([^"]*)"', confirm.text))
            started = await client.post(f"{PREFIX}/ui/jobs/actions", data=fields)
            assert started.status_code == 303, started.text
            assert started.headers["location"].startswith(f"{PREFIX}/ui/jobs/actions/")
            progress = await client.get(started.headers["location"])
            assert all(link.startswith(PREFIX) for link in links(progress.text))
            # the API under the prefix, with the bearer token
            api = await client.get(f"{PREFIX}/queues", headers={"Authorization": f"Bearer {TOKEN}"})
            assert api.status_code == 200 and api.json()["queues"][0]["paused_by"] == "alice"
            assert (await client.get(f"{PREFIX}/queues")).status_code == 401
            out = await client.post(f"{PREFIX}/ui/logout", data={"csrf": csrf_of(log)})
            assert out.headers["location"] == f"{PREFIX}/ui/login"
    actors = await conn.fetch("SELECT action, actor FROM pgworker.operator_log ORDER BY id")
    assert [(r["action"], r["actor"]) for r in actors] == [
        ("pause", "alice"),
        ("bulk_cancel", "alice"),
    ]
    assert await conn.fetchval("SELECT actor FROM pgworker.bulk_actions") == "alice"
    event = await conn.fetchval(
        "SELECT actor FROM pgworker.job_events WHERE job_id = $1", failed.job.id
    )
    assert event == "alice"


@contextlib.asynccontextmanager
async def mounted(app: object) -> AsyncIterator[httpx.AsyncClient]:
    """`app` mounted under PREFIX in a Starlette app, driven in process (no lifespan runs)."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    outer = Starlette(routes=[Mount(PREFIX, app=app)])  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=outer)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


async def test_a_pool_passed_in_is_used_and_left_open(pool):
    app = create_app(pool, operators=[Operator("alice", TOKEN)])
    async with mounted(app) as client:
        answer = await client.get(f"{PREFIX}/queues", headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200
        assert app.state.pool is pool
    assert not pool.is_closing()
    assert await pool.fetchval("SELECT 1") == 1


async def test_a_dsn_opens_its_pool_at_the_first_request(dsn):
    app = create_app(dsn, operators=[Operator("alice", TOKEN)])
    assert app.state.pool is None
    async with mounted(app) as client:
        answer = await client.get(f"{PREFIX}/queues", headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200
        assert isinstance(app.state.pool, asyncpg.Pool)
    await app.state.pool.close()


async def test_create_app_refuses_bad_options(dsn):
    with pytest.raises(ConfigError) as caught:
        create_app(dsn)
    assert caught.value.field == "operators"
    with pytest.raises(ConfigError) as caught:
        create_app(dsn, operators=[("alice", TOKEN, "operate")])  # type: ignore[list-item]
    assert caught.value.field == "operators"
    with pytest.raises(ConfigError) as caught:
        create_app(dsn, trusted_user_header="X Forwarded")
    assert caught.value.field == "trusted_user_header"
    with pytest.raises(ConfigError) as caught:
        create_app(42, insecure_no_auth=True)
    assert caught.value.field == "dsn_or_pool"
