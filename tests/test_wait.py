"""Awaiting a job (issue 24, item 2) against real `pgworker run` processes: `pgworker.wait`
returns within 100 ms of the job's end (measured on the database's clock against the attempt's
`finished_at`) with 200 jobs awaited at once from one process on one connection; completed,
failed and cancelled jobs all return; a timeout raises TimeoutError and leaves the job as it was;
an unknown id, a bad timeout and a job deleted while awaited raise instead of waiting forever; the
caller's connection or pool is never used to wait. The HTTP long poll is in test_http_wait.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import pgworker
from pgworker import _waits

from .helpers import spawn_worker, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

WITHIN = 0.1
"""The promise: a wait returns within this of its job's end."""
JOBS = 200


@contextlib.asynccontextmanager
async def worker(dsn: str, tmp_path: Path, *args: str) -> AsyncIterator[subprocess.Popen[bytes]]:
    """A real `pgworker run tests.apps.waits` serving queue `default`, registered when it yields."""
    log = tmp_path / "worker.log"
    proc = spawn_worker(
        "tests.apps.waits", dsn, log, "--concurrency", "50", "--worker-id", "waits", *args
    )
    conn = await asyncpg.connect(dsn)
    try:

        async def registered() -> bool:
            assert proc.poll() is None, log.read_text()[-2000:]
            return bool(await conn.fetchval("SELECT count(*) FROM pgworker.workers"))

        await wait_for(registered, timeout=30)
        yield proc
    finally:
        await conn.close()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        finally:
            proc.kill()
        assert code == 0, log.read_text()[-2000:]


def waiter_name() -> str:
    return f"{_waits.APPLICATION_NAME}:{os.getpid()}"


async def waiter_connections(conn: Any) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", waiter_name()
        )
    )


async def clock_offset(conn: Any) -> float:
    """The database's clock minus this machine's, in seconds (the middle of the round trip)."""
    before = time.time()
    db = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
    after = time.time()
    return float(db) - (before + after) / 2


async def test_200_waits_return_within_100ms_of_each_end_on_one_connection(
    dsn: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    rng = random.Random(24)
    specs = [
        pgworker.JobSpec("nap", {"n": i, "ms": rng.randrange(300, 3000)}) for i in range(JOBS)
    ]
    # Enqueued before the worker starts: every wait is registered while its job is pending.
    ids = [r.job.id for r in await pgworker.enqueue_many(conn, specs)]
    returned: dict[int, float] = {}

    async def one(job_id: int) -> pgworker.Job:
        job = await pgworker.wait(dsn, job_id, timeout=60)
        returned[job_id] = time.time()
        return job

    waits = [asyncio.create_task(one(i)) for i in ids]
    try:
        await wait_for(lambda: _all_awaited(conn, JOBS))
        async with worker(dsn, tmp_path):
            while not all(w.done() for w in waits):
                assert await waiter_connections(conn) == 1
                await asyncio.sleep(0.05)
            jobs = [await w for w in waits]
    finally:
        for w in waits:
            w.cancel()
    offset = await clock_offset(conn)
    assert [j.status for j in jobs] == ["completed"] * JOBS
    assert [j.result for j in jobs] == [{"n": i} for i in range(JOBS)]
    ended = {
        r["job_id"]: r["finished_at"].timestamp()
        for r in await conn.fetch(
            "SELECT job_id, finished_at FROM pgworker.job_attempts WHERE job_id = ANY($1)", ids
        )
    }
    late = {i: returned[i] + offset - ended[i] for i in ids}
    print(f"wait latency after finished_at: max {max(late.values()) * 1000:.1f} ms")
    assert max(late.values()) < WITHIN, sorted(late.values())[-10:]
    assert min(late.values()) > -0.05  # returned after the end, not before (clock check)
    assert _waits.waiter(dsn).connections == 1


async def _all_awaited(conn: Any, n: int) -> bool:
    return bool(await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE awaited") == n)
