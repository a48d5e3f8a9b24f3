"""Awaiting a job against real `pgworker run` processes: `pgworker.wait`
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

from .helpers import fake_claim, spawn_worker, wait_for

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
            code: int | None = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            proc.kill()
        assert code == 0, f"exit {code}: {log.read_text()[-2000:]}"


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
    specs = [pgworker.JobSpec("nap", {"n": i, "ms": rng.randrange(300, 3000)}) for i in range(JOBS)]
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


async def test_failed_and_cancelled_jobs_return_too(
    dsn: str, conn: asyncpg.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each end is announced: with the poll out of the way, only a notification returns them."""
    monkeypatch.setattr(_waits, "POLL_INTERVAL", 600.0)
    failed = await pgworker.enqueue(conn, "boom")
    pending = await pgworker.enqueue(conn, "nap", queue="nobody")
    running = await pgworker.enqueue(conn, "nap", {"ms": 60_000})
    async with worker(dsn, tmp_path):
        job = await failed.wait(dsn, timeout=10)
        assert job.status == "failed" and "boom" in (job.error or "")
        # A pending job cancelled by an operator, and a running one stopped by its worker.
        cancelled = asyncio.create_task(pgworker.wait(dsn, pending.job.id, timeout=10))
        await wait_for(lambda: _all_awaited(conn, 1))
        await pgworker.cancel(conn, pending.job.id)
        assert (await cancelled).status == "cancelled"
        await wait_for(lambda: _status(conn, running.job.id, "running"))
        stopped = asyncio.create_task(running.wait(dsn, timeout=10))
        await wait_for(lambda: _all_awaited(conn, 2))
        assert await pgworker.cancel(conn, running.job.id) == "cancelling"
        assert (await stopped).status == "cancelled"


async def test_a_job_the_rescue_fails_returns_too(
    dsn: str, conn: asyncpg.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job whose worker vanished, out of retries, is failed by the leader's rescue: announced
    as any other end (the trigger sees every path to a final status)."""
    monkeypatch.setattr(_waits, "POLL_INTERVAL", 600.0)
    job = (await pgworker.enqueue(conn, "nap", queue="nobody", max_retries=0)).job
    await fake_claim(conn, job.id)
    waiting = asyncio.create_task(pgworker.wait(dsn, job.id, timeout=30))
    await wait_for(lambda: _all_awaited(conn, 1))
    async with worker(dsn, tmp_path, "--lease", "2"):
        ended = await waiting
    assert ended.status == "failed"


async def _status(conn: Any, job_id: int, status: str) -> bool:
    found = await conn.fetchval("SELECT status FROM pgworker.jobs WHERE id = $1", job_id)
    return bool(found == status)


async def test_a_timeout_raises_and_leaves_the_job_alone(
    dsn: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    pending = (await pgworker.enqueue(conn, "nap", queue="nobody")).job
    before = await pgworker.get_job(conn, pending.id)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await pgworker.wait(dsn, pending.id, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 2
    assert await pgworker.get_job(conn, pending.id) == before
    running = (await pgworker.enqueue(conn, "nap", {"ms": 60_000})).job
    async with worker(dsn, tmp_path):
        await wait_for(lambda: _status(conn, running.id, "running"))
        before = await pgworker.get_job(conn, running.id)
        with pytest.raises(TimeoutError):
            await pgworker.wait(dsn, running.id, timeout=0.2)
        assert await pgworker.get_job(conn, running.id) == before
        await pgworker.cancel(conn, running.id)


async def test_an_unknown_id_raises_at_once(dsn: str) -> None:
    started = time.monotonic()
    with pytest.raises(pgworker.ValidationError) as caught:
        await pgworker.wait(dsn, 10**12, timeout=60)
    assert caught.value.field == "job_id"
    assert "there is no job" in str(caught.value)
    assert time.monotonic() - started < _waits.POLL_INTERVAL


@pytest.mark.parametrize("timeout", [-1, -0.001, float("nan"), float("inf"), "5", True, [1]])
async def test_a_bad_timeout_is_refused(dsn: str, conn: asyncpg.Connection, timeout: Any) -> None:
    job = (await pgworker.enqueue(conn, "nap", queue="nobody")).job
    with pytest.raises(pgworker.ValidationError) as caught:
        await pgworker.wait(dsn, job.id, timeout=timeout)
    assert caught.value.field == "timeout"
    assert not await conn.fetchval("SELECT awaited FROM pgworker.jobs WHERE id = $1", job.id)


@pytest.mark.parametrize("job_id", [0, -1, "1", 1.0, True, 2**63])
async def test_a_bad_job_id_is_refused(dsn: str, job_id: Any) -> None:
    with pytest.raises(pgworker.ValidationError) as caught:
        await pgworker.wait(dsn, job_id)
    assert caught.value.field == "job_id"


async def test_a_job_deleted_while_awaited_raises(dsn: str, conn: asyncpg.Connection) -> None:
    job = (await pgworker.enqueue(conn, "nap", queue="nobody")).job
    waiting = asyncio.create_task(pgworker.wait(dsn, job.id, timeout=30))
    await wait_for(lambda: _all_awaited(conn, 1))
    await conn.execute("DELETE FROM pgworker.jobs WHERE id = $1", job.id)
    with pytest.raises(pgworker.PgWorkerError, match="deleted while awaited"):
        await asyncio.wait_for(waiting, _waits.POLL_INTERVAL * 3)


async def test_a_connection_or_pool_is_never_used_to_wait(
    dsn: str, conn: asyncpg.Connection, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """Given a Connection, the waiter opens its own to the same database (the caller's
    transaction is left as it was); given a Pool, no connection of it is held."""
    a = await pgworker.enqueue(conn, "nap", {"n": 1})
    b = await pgworker.enqueue(conn, "nap", {"n": 2})
    async with worker(dsn, tmp_path):
        async with conn.transaction():
            await conn.execute("SELECT 1")
            assert (await a.wait(conn, timeout=30)).result == {"n": 1}
            assert conn.is_in_transaction()
        assert (await b.wait(pool, timeout=30)).result == {"n": 2}
        assert pool.get_idle_size() == pool.get_size()
        async with pool.acquire() as proxy:
            assert (await pgworker.wait(proxy, b.job.id, timeout=30)).result == {"n": 2}


async def test_the_waiter_closes_its_connection_when_idle(
    dsn: str, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_waits, "IDLE_CLOSE", 0.2)
    job = (await pgworker.enqueue(conn, "nap", queue="nobody")).job
    with pytest.raises(TimeoutError):
        await pgworker.wait(dsn, job.id, timeout=0.1)
    await wait_for(lambda: _no_waiter(conn), timeout=5)


async def _no_waiter(conn: Any) -> bool:
    return await waiter_connections(conn) == 0


async def test_a_lost_connection_is_replaced_and_its_waits_go_on(
    dsn: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    job = (await pgworker.enqueue(conn, "nap", {"n": 7})).job
    waiting = asyncio.create_task(pgworker.wait(dsn, job.id, timeout=60))
    await wait_for(lambda: _all_awaited(conn, 1))
    killed = await conn.fetchval(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
        waiter_name(),
    )
    assert killed == 1
    async with worker(dsn, tmp_path):
        assert (await asyncio.wait_for(waiting, 30)).result == {"n": 7}


# --- waits a hostile user makes --------------------------------------------------------------


async def test_wait_with_timeout_zero_returns_a_job_already_ended(conn, dsn) -> None:
    """timeout=0 asks "has it ended?": a job that ended is returned, not a TimeoutError."""
    job = await pgworker.enqueue(conn, "t", {})
    await pgworker.cancel(conn, job.job.id)
    ended = await pgworker.wait(dsn, job.job.id, timeout=0)
    assert ended.status == "cancelled"


async def test_a_row_lock_on_one_awaited_job_does_not_hold_every_wait(conn, dsn) -> None:
    """A transaction holding a lock on one awaited job (a caller's enqueue after= it, an
    update_job in a long transaction) must not stall the waits of other jobs of the process."""
    locked = await pgworker.enqueue(conn, "t", {})
    done = await pgworker.enqueue(conn, "t", {})
    await pgworker.cancel(conn, done.job.id)
    other = await asyncpg.connect(dsn)
    try:
        tx = other.transaction()
        await tx.start()
        await pgworker.enqueue(other, "child", {}, after=[locked.job.id])
        slow = asyncio.ensure_future(pgworker.wait(dsn, locked.job.id))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        ended = await pgworker.wait(dsn, done.job.id, timeout=5)
        assert ended.status == "cancelled"
        assert time.monotonic() - started < 3
        await tx.rollback()
        slow.cancel()
    finally:
        await other.close()
