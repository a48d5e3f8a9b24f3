"""Who runs a bulk action, wherever the console runs: a console mounted in a user's FastAPI
application (on a DSN, or on the application's pool), with no `pgworker serve` anywhere, runs the
bulk replay it creates from its page; an action whose console was killed (SIGKILL, in the middle
of it) is adopted, once its lease lapsed, by the workers' maintenance leader, or by another
console, and finished with no job replayed twice; and `pgworker serve` and a mounted console on
two ports of one host keep each its own login in one browser. Real uvicorn, Chromium and
PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

import pgworker
from pgworker import _bulk as bulk
from pgworker._filters import JobFilter
from pgworker._maintenance.maintenance import Maintenance

from .helpers import wait_for
from .test_bulk import replays_of, seed_failed
from .test_dashboard import WAIT, browser, css, page, text_of, until
from .webserver import ROOT, free_port, serving

pytestmark = pytest.mark.asyncio(loop_scope="session")
__all__ = ["browser", "page"]  # the fixtures, used by name

PREFIX = "/admin/jobs"
ALICE = "alice-token-0123456789"  # an operator of tests/apps/mounted.py
BOB = "bob-token-0123456789"
POOLED = "tests.apps.mounted:app"  # the recipe of docs/operations/operators.md: the app's pool
ON_DSN = "tests.apps.mounted_dsn:app"  # the same, on a DSN


@contextlib.contextmanager
def console(app: str, dsn: str, env: dict[str, str] | None = None) -> Iterator[Any]:
    """`app` (a user's application with the console under PREFIX) under uvicorn on 127.0.0.1
    and a free port: its base URL and process, its stderr shown when the block fails."""
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="pgw-mounted-", suffix=".log")[1])
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "PGWORKER_TEST_APP_DSN": dsn}
    with log.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", app, "--port", str(port), "--log-level", "warning"],
            cwd=ROOT,
            env={**environment, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        yield f"http://127.0.0.1:{port}", process
    except BaseException:
        print(log.read_text(errors="replace"))
        raise
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.unlink(missing_ok=True)


async def ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT
    async with httpx.AsyncClient(base_url=url) as client:
        while True:
            assert process.poll() is None, "uvicorn exited"
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/")).status_code == 200:
                    return
            assert time.monotonic() < deadline, "uvicorn did not start"
            await anyio.sleep(0.05)


def log_in(driver: Any, base: str, token: str) -> None:
    """Log in to the console at `base` (its root, the mount prefix included)."""
    driver.get(f"{base}/ui/login")
    css(driver, "#token").send_keys(token)
    css(driver, "form[action$='/ui/login'] button[type=submit]").click()
    until(driver, lambda d: d.current_url == f"{base}/")


async def state_of(conn: Any, action_id: int) -> Any:
    return await conn.fetchrow(
        "SELECT state, done, runner, runner_kind FROM pgworker.bulk_actions WHERE id = $1",
        action_id,
    )


@pytest.mark.parametrize("app", [POOLED, ON_DSN], ids=["pool", "dsn"])
async def test_a_mounted_console_runs_the_bulk_replay_it_creates_without_serve(
    page: Any, dsn: str, conn: Any, app: str
) -> None:
    ids = await seed_failed(conn, 1000)
    with console(app, dsn) as (url, process):
        await ready(url, process)
        base = url + PREFIX
        log_in(page, base, ALICE)
        page.get(f"{base}/ui/jobs/actions/new?kind=replay&status=failed")
        assert css(page, "#matched").text == "1,000"
        css(page, "form.bulk button[type=submit]").click()
        until(page, lambda d: "/ui/jobs/actions/" in d.current_url and "new" not in d.current_url)
        action_id = int(page.current_url.rstrip("/").rsplit("/", 1)[1])
        await wait_for(
            lambda: conn.fetchval(
                "SELECT state <> 'running' FROM pgworker.bulk_actions WHERE id = $1", action_id
            ),
            timeout=WAIT,
        )
        page.refresh()  # rather than the page's own refresh, 3 s later
        progress = css(page, "#progress")
        assert progress.get_attribute("data-state") == "done"
        assert "1,000 jobs replayed" in progress.text
        assert css(page, "progress").get_attribute("value") == "1000"
        assert "by console console-" in css(page, "#runner").text
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {ALICE}"}
        ) as client:
            answer = (await client.get(f"/jobs/actions/{action_id}")).json()
    assert (answer["status"], answer["done"], answer["runner"]["kind"]) == ("done", 1000, "console")
    assert answer["runner"]["id"].startswith("console-") and answer["runner"]["since"]
    assert await replays_of(conn, ids) == dict.fromkeys(ids, 1)
    pending = "SELECT count(*) FROM pgworker.jobs WHERE status = 'pending' AND id = ANY($1)"
    assert await conn.fetchval(pending, ids) == 1000


async def test_an_action_whose_console_was_killed_is_finished_by_the_workers_leader(
    dsn: str, conn: Any, pool: Any
) -> None:
    """The console's sixth batch (of 100 jobs) waits on a job row the test holds: the console is
    SIGKILLed there, 500 jobs replayed. Its lease (1 s) lapses; the maintenance leader of a
    worker adopts the action and finishes it, each job replayed once."""
    ids = await seed_failed(conn, 1000)
    holder = await asyncpg.connect(dsn)
    held = holder.transaction()
    await held.start()
    await holder.execute("SELECT 1 FROM pgworker.jobs WHERE id = $1 FOR UPDATE", ids[550])
    env = {"PGWORKER_BULK_BATCH": "100", "PGWORKER_BULK_LEASE": "1"}
    try:
        with console(ON_DSN, dsn, env) as (url, process):
            await ready(url, process)
            async with httpx.AsyncClient(
                base_url=url + PREFIX, headers={"Authorization": f"Bearer {ALICE}"}
            ) as client:
                answer = await client.post(
                    "/jobs/actions/replay", json={"filter": {"status": "failed"}}
                )
            assert answer.status_code == 202, answer.text
            action = answer.json()
            assert action["runner"]["kind"] == "console"  # taken by the console that made it
            await wait_for(
                lambda: conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database() AND application_name = 'pgworker:web'"
                ),
                timeout=WAIT,
            )
            process.send_signal(signal.SIGKILL)
            process.wait()
    finally:
        await held.rollback()
        await holder.close()
    killed = await state_of(conn, action["id"])
    assert (killed["state"], killed["done"], killed["runner_kind"]) == ("running", 500, "console")
    leader = Maintenance(pool, pgworker.Settings(dsn=dsn, worker_id="worker-1"))

    async def finished() -> bool:
        await leader.tick()
        return bool((await state_of(conn, action["id"]))["state"] == "done")

    await wait_for(finished, timeout=WAIT, every=0.05)
    await leader.resign()
    done = await state_of(conn, action["id"])
    assert (done["done"], done["runner"], done["runner_kind"]) == (1000, "worker-1", "worker")
    assert await replays_of(conn, ids) == dict.fromkeys(ids, 1)


async def test_a_console_adopts_an_action_once_its_runners_lease_lapsed_not_before(
    pool: Any, conn: Any
) -> None:
    await seed_failed(conn, 3)
    failed = JobFilter.parse({"status": "failed"})
    live = await bulk.create(pool, "replay", failed, holder=bulk.Holder("console-a", "console"))
    orphan = await bulk.create(pool, "replay", failed, holder=bulk.Holder("console-b", "console"))
    assert (live.runner, live.runner_kind, orphan.runner) == ("console-a", "console", "console-b")
    await conn.execute(
        "UPDATE pgworker.bulk_actions SET lease_until = now() - interval '1 second' WHERE id = $1",
        orphan.id,
    )
    await bulk.Runner(pool, "pgworker", bulk.Holder("console-c", "console")).round()
    assert tuple(await state_of(conn, orphan.id)) == ("done", 3, "console-c", "console")
    assert tuple(await state_of(conn, live.id)) == ("running", 0, "console-a", "console")


async def test_serve_and_a_mounted_console_on_two_ports_each_keep_their_login(
    page: Any, dsn: str, conn: Any
) -> None:
    first, second = await seed_failed(conn, 2)
    env = {"PGWORKER_TOKENS": f"bob:{BOB}:operate"}
    with console(POOLED, dsn) as (url, process):  # starting while serve starts
        async with serving(dsn, token=None, env=env) as served:
            await ready(url, process)
            mounted = url + PREFIX
            log_in(page, served.url, BOB)
            log_in(page, mounted, ALICE)  # the same host: the browser sends both its cookies
            for base, job_id in [(served.url, first), (mounted, second)]:
                page.get(f"{base}/ui/jobs/{job_id}")
                css(page, "form[action$='/replay'] button").click()
                until(page, lambda d, j=job_id: f"Job {j} was put back" in text_of(d))
            page.get(f"{served.url}/ui/log")
            shown = text_of(page)
    assert "bob" in shown and "alice" in shown
    rows = await conn.fetch("SELECT job_id, actor FROM pgworker.job_events WHERE kind = 'replayed'")
    assert {r["job_id"]: r["actor"] for r in rows} == {first: "bob", second: "alice"}
