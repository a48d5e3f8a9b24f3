"""Every cancel of a running job, a single one or a bulk action's, tells its worker at once (one
cancel statement, _cancel.sql, notifies): the handler stops well before the worker's next
heartbeat, which would otherwise be the first to hear of it."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

import pgworker
from pgworker import _bulk as bulk
from pgworker._filters import JobFilter

from .helpers import all_finished, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

LEASE = 60.0
"""The heartbeat comes every third of it: 20 seconds, far past PROMPT."""

PROMPT = 5.0


async def _single(conn: Any, pool: Any, job_id: int) -> None:
    assert await pgworker.cancel(conn, job_id) == "cancelling"


async def _bulk(conn: Any, pool: Any, job_id: int) -> None:
    action = await bulk.create(pool, "cancel", JobFilter.parse({"id": job_id}), by="bob")
    done = await bulk.run(pool, action.id)
    assert done is not None and (done.done, done.skipped) == (1, 0)


@pytest.mark.parametrize("cancel", [_single, _bulk], ids=["single", "bulk"])
async def test_a_cancelled_running_job_is_interrupted_before_its_next_heartbeat(
    dsn: str, conn: Any, pool: Any, cancel: Any
) -> None:
    registry = pgworker.Registry()
    started = anyio.Event()
    interrupted: list[float] = []

    @registry.task("t")
    async def handle(ctx: Any, payload: Any) -> None:
        started.set()
        try:
            await anyio.sleep(10 * LEASE)
        except anyio.get_cancelled_exc_class():
            interrupted.append(time.monotonic())
            raise

    r = await pgworker.enqueue(conn, "t", {})
    async with pgworker.Worker(registry, dsn, lease=LEASE, poll_interval=0.05):
        await wait_for(started.is_set)
        asked = time.monotonic()
        await cancel(conn, pool, r.job.id)
        await wait_for(lambda: interrupted, timeout=PROMPT)
        await wait_for(lambda: all_finished(conn), timeout=PROMPT)
    assert interrupted[0] - asked < PROMPT
    job = await pgworker.get_job(conn, r.job.id)
    assert job.status == "cancelled"
