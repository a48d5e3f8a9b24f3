"""The worker runtime against a real PostgreSQL: order, concurrency, wake-up, outcomes, attempts."""

from __future__ import annotations

import json
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta

import anyio
import asyncpg
import pytest
from structlog.testing import capture_logs

import pgworker
from pgworker import JobSpec, RetryPolicy

from .helpers import all_finished, attempts, logged, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

FAST = RetryPolicy(max_retries=3, initial_delay=0.05, max_delay=0.2, jitter=0.1)


async def test_priority_then_fifo_with_concurrency_one(dsn, conn):
    registry = pgworker.Registry()
    seen: list[int] = []

    @registry.task("t")
    async def handle(ctx, payload):
        seen.append(payload["n"])

    specs = [
        JobSpec("t", {"n": n}, priority=p)
        for n, p in [(1, 0), (2, 20), (3, 0), (4, 30), (5, 20), (6, "low"), (7, "critical")]
    ]
    await pgworker.enqueue_many(conn, specs)
    async with pgworker.Worker(registry, dsn, concurrency=1):
        await wait_for(lambda: all_finished(conn))
    assert seen == [4, 7, 2, 5, 1, 3, 6]


async def test_job_with_future_run_at_waits(dsn, conn):
    registry = pgworker.Registry()
    seen: list[str] = []

    @registry.task("t")
    async def handle(ctx, payload):
        seen.append(payload["name"])

    later = await pgworker.enqueue(
        conn, "t", {"name": "later"}, run_at=datetime.now(UTC) + timedelta(hours=1)
    )
    soon = await pgworker.enqueue(conn, "t", {"name": "soon"}, delay=0.3)
    now = await pgworker.enqueue(conn, "t", {"name": "now"})
    async with pgworker.Worker(registry, dsn, poll_interval=0.05):
        await wait_for(lambda: len(seen) == 2)
        assert seen == ["now", "soon"]
        job = await pgworker.get_job(conn, soon.job.id)
        assert job.claimed_at >= soon.job.run_at
        assert (await pgworker.get_job(conn, later.job.id)).status == "pending"
    assert (await pgworker.get_job(conn, now.job.id)).status == "completed"


async def test_peak_concurrency_equals_the_limit(dsn, conn):
    registry = pgworker.Registry()
    running = 0
    peak = 0
    limit = 4

    @registry.task("t")
    async def handle(ctx, payload):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.05)
        running -= 1

    await pgworker.enqueue_many(conn, [JobSpec("t", {"n": i}) for i in range(5 * limit)])
    async with pgworker.Worker(registry, dsn, concurrency=limit):
        await wait_for(lambda: all_finished(conn))
    assert peak == limit


async def test_idle_worker_wakes_on_notify_not_poll(dsn, pool):
    registry = pgworker.Registry()
    started: dict[int, float] = {}
    done = anyio.Event()

    @registry.task("t")
    async def handle(ctx, payload):
        started[payload["n"]] = time.monotonic()
        if len(started) == 10:
            done.set()

    delays = []
    async with pgworker.Worker(registry, dsn, poll_interval=60.0):
        for n in range(10):
            t0 = time.monotonic()
            await pgworker.enqueue(pool, "t", {"n": n})
            await wait_for(lambda n=n: n in started, timeout=5)
            delays.append(started[n] - t0)
        await done.wait()
    assert statistics.median(delays) < 0.2, delays


async def test_transient_failures_retry_with_backoff_then_succeed(dsn, conn):
    registry = pgworker.Registry()
    calls: list[float] = []

    @registry.task("flaky", retry=FAST)
    async def flaky(ctx, payload):
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise ValueError(f"boom {len(calls)}")
        return {"ok": True}

    r = await pgworker.enqueue(conn, "flaky", {})
    async with pgworker.Worker(registry, dsn, poll_interval=0.05):
        await wait_for(lambda: all_finished(conn))
    job = await pgworker.get_job(conn, r.job.id)
    assert job.status == "completed" and job.result == {"ok": True}
    assert job.retry_count == 2 and job.attempts == 3 and job.max_retries == 3
    assert job.error is None  # completed: the failures' reasons are in job_attempts
    rows = await attempts(conn, r.job.id)
    assert [a["outcome"] for a in rows] == ["retried", "retried", "completed"]
    assert [a["error_message"] for a in rows] == ["boom 1", "boom 2", None]
    assert all(a["finished_at"] and a["worker_id"] for a in rows)
    assert calls[1] - calls[0] >= 0.05 * 0.9  # first retry waits initial_delay ± jitter
    assert calls[2] - calls[1] >= 0.1 * 0.9  # second retry waits twice as long


async def test_requeued_job_keeps_its_error_while_pending(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("t", retry=RetryPolicy(max_retries=1, initial_delay=3600, max_delay=3600))
    async def fail(ctx, payload):
        raise ConnectionError("smtp down")

    r = await pgworker.enqueue(conn, "t", {})
    async with pgworker.Worker(registry, dsn):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT retry_count = 1 FROM pgworker.jobs WHERE id = $1", r.job.id
            )
        )
    job = await pgworker.get_job(conn, r.job.id)
    assert job.status == "pending" and job.error == "ConnectionError: smtp down"
    assert (job.run_at - job.updated_at).total_seconds() == pytest.approx(3600, rel=0.11)


async def test_exhausted_retries_and_zero_retries_fail(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("t", retry=FAST)
    async def fail(ctx, payload):
        raise RuntimeError("nope")

    exhausted = await pgworker.enqueue(conn, "t", {"n": 1}, max_retries=2)
    zero = await pgworker.enqueue(conn, "t", {"n": 2}, max_retries=0)
    async with pgworker.Worker(registry, dsn, poll_interval=0.05):
        await wait_for(lambda: all_finished(conn))
    job = await pgworker.get_job(conn, exhausted.job.id)
    assert (job.status, job.retry_count, job.attempts) == ("failed", 2, 3)
    assert [a["outcome"] for a in await attempts(conn, job.id)] == ["retried", "retried", "failed"]
    job = await pgworker.get_job(conn, zero.job.id)
    assert (job.status, job.retry_count, job.attempts, job.error) == (
        "failed",
        0,
        1,
        "RuntimeError: nope",
    )
    assert job.finished_at is not None


async def test_permanent_error_fails_at_once(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("t", max_retries=5)
    async def fail(ctx, payload):
        raise pgworker.PermanentError("card declined")

    r = await pgworker.enqueue(conn, "t", {})
    async with pgworker.Worker(registry, dsn):
        await wait_for(lambda: all_finished(conn))
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.attempts, job.retry_count, job.max_retries) == ("failed", 1, 0, 5)
    assert job.error == "PermanentError: card declined"
    rows = await attempts(conn, job.id)
    assert [(a["outcome"], a["error_type"]) for a in rows] == [("failed", "PermanentError")]


async def test_retry_after_reschedules(dsn, conn):
    registry = pgworker.Registry()
    calls: list[float] = []

    @registry.task("t")
    async def later(ctx, payload):
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise pgworker.Retry(after=0.5)

    r = await pgworker.enqueue(conn, "t", {})
    async with pgworker.Worker(registry, dsn, poll_interval=60):
        await wait_for(lambda: all_finished(conn))
    assert calls[1] - calls[0] >= 0.5
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.retry_count) == ("completed", 1)
    assert [a["outcome"] for a in await attempts(conn, job.id)] == ["retried", "completed"]


async def test_task_timeout_is_recorded_as_timed_out(dsn, conn):
    registry = pgworker.Registry()

    @registry.task(
        "slow",
        timeout=0.1,
        max_retries=1,
        retry=RetryPolicy(max_retries=1, initial_delay=0.01, max_delay=0.01),
    )
    async def slow(ctx, payload):
        await anyio.sleep(10)

    @registry.task("raises-timeout", max_retries=0)
    async def raises(ctx, payload):
        raise TimeoutError("upstream timed out")

    r = await pgworker.enqueue(conn, "slow", {})
    own = await pgworker.enqueue(conn, "raises-timeout", {})
    async with pgworker.Worker(registry, dsn, poll_interval=0.05):
        await wait_for(lambda: all_finished(conn))
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.retry_count) == ("failed", 1)
    assert [a["outcome"] for a in await attempts(conn, job.id)] == ["timed_out", "timed_out"]
    assert job.error.startswith("TimeoutError: timed out after 0.1s")
    assert [a["outcome"] for a in await attempts(conn, own.job.id)] == ["failed"]


async def test_sync_handlers_run_in_threads_and_results_are_stored(dsn, conn):
    registry = pgworker.Registry()
    loop_thread = threading.get_ident()
    threads = []

    @registry.task("sync")
    def handle(ctx, payload):
        threads.append(threading.get_ident())
        time.sleep(0.01)
        return {"double": payload["n"] * 2, "job": ctx.job_id, "attempt": ctx.attempt}

    r = await pgworker.enqueue(conn, "sync", {"n": 21})
    async with pgworker.Worker(registry, dsn):
        await wait_for(lambda: all_finished(conn))
    job = await pgworker.get_job(conn, r.job.id)
    assert job.result == {"double": 42, "job": r.job.id, "attempt": 1}
    assert threads and threads[0] != loop_thread


async def test_context_and_correlation_inheritance(dsn, conn, pool):
    registry = pgworker.Registry()
    contexts = []

    @registry.task("parent")
    async def parent(ctx, payload):
        contexts.append(ctx)
        await pgworker.enqueue(pool, "child", {})
        await pgworker.enqueue(pool, "child", {"own": True}, correlation_id="other")

    @registry.task("child")
    async def child(ctx, payload):
        contexts.append(ctx)

    r = await pgworker.enqueue(conn, "parent", {"p": 1}, correlation_id="req-123")
    async with pgworker.Worker(registry, dsn, worker_id="w-ctx") as worker:
        assert worker.worker_id == "w-ctx"
        await wait_for(lambda: all_finished(conn))
        await wait_for(lambda: len(contexts) == 3)
    first = contexts[0]
    assert (first.job_id, first.attempt, first.correlation_id, first.worker_id, first.payload) == (
        r.job.id,
        1,
        "req-123",
        "w-ctx",
        {"p": 1},
    )
    children = {json.dumps(c.payload): c.correlation_id for c in contexts[1:]}
    assert children == {"{}": "req-123", '{"own": true}': "other"}


async def test_one_attempt_row_per_attempt(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("t", retry=FAST)
    async def handle(ctx, payload):
        if ctx.attempt < payload["succeed_on"]:
            raise ValueError("again")

    jobs = await pgworker.enqueue_many(conn, [JobSpec("t", {"succeed_on": n}) for n in (1, 2, 3)])
    async with pgworker.Worker(registry, dsn, poll_interval=0.05, code_version="v1.2.3"):
        await wait_for(lambda: all_finished(conn))
    for n, r in zip((1, 2, 3), jobs, strict=True):
        rows = await attempts(conn, r.job.id)
        assert [a["attempt"] for a in rows] == list(range(1, n + 1))
        assert [a["outcome"] for a in rows] == ["retried"] * (n - 1) + ["completed"]
        assert all(a["code_version"] == "v1.2.3" and a["type"] == "t" for a in rows)
        assert all(a["correlation_id"] == r.job.correlation_id for a in rows)


async def test_only_served_types_and_queues_are_claimed(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("known")
    async def handle(ctx, payload):
        pass

    unknown = await pgworker.enqueue(conn, "unknown", {})
    other_queue = await pgworker.enqueue(conn, "known", {}, queue="other")
    mine = await pgworker.enqueue(conn, "known", {})
    async with pgworker.Worker(registry, dsn):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'completed' FROM pgworker.jobs WHERE id = $1", mine.job.id
            )
        )
    for r in (unknown, other_queue):
        assert (await pgworker.get_job(conn, r.job.id)).status == "pending"


@pytest.mark.fresh_db  # it deletes the applied migrations
async def test_worker_refuses_a_missing_older_or_newer_schema(empty_dsn, dsn):
    registry = pgworker.Registry()

    @registry.task("t")
    async def handle(ctx, payload):
        pass

    with pytest.raises(pgworker.SchemaError, match="run `pgworker migrate`"):
        async with pgworker.Worker(registry, empty_dsn):
            pass
    c = await asyncpg.connect(dsn)
    try:
        await c.execute("INSERT INTO pgworker.migrations (version, name) VALUES (999, 'future')")
        with pytest.raises(pgworker.SchemaError, match="upgrade pgworker"):
            await pgworker.Worker(registry, dsn).run()
        await c.execute("DELETE FROM pgworker.migrations")
        await c.execute("INSERT INTO pgworker.migrations (version, name) VALUES (0, 'old')")
        with pytest.raises(pgworker.SchemaError, match="run `pgworker migrate`"):
            await pgworker.Worker(registry, dsn).run()
    finally:
        await c.close()


async def test_graceful_stop_hands_back_what_outlives_the_grace_period(dsn, conn):
    registry = pgworker.Registry()
    started = anyio.Event()

    @registry.task("quick")
    async def quick(ctx, payload):
        await started.wait()
        await anyio.sleep(0.05)

    @registry.task("stuck")
    async def stuck(ctx, payload):
        started.set()
        await anyio.sleep(60)

    q = await pgworker.enqueue(conn, "quick", {})
    s = await pgworker.enqueue(conn, "stuck", {})
    async with pgworker.Worker(registry, dsn, shutdown_timeout=0.5):
        await started.wait()
    assert (await pgworker.get_job(conn, q.job.id)).status == "completed"
    job = await pgworker.get_job(conn, s.job.id)
    assert (job.status, job.retry_count) == ("pending", 0)
    assert [a["outcome"] for a in await attempts(conn, s.job.id)] == ["interrupted"]
    assert await conn.fetchval("SELECT count(*) FROM pgworker.workers") == 0


async def test_an_error_in_the_worker_block_still_stops_gracefully(dsn, conn):
    registry = pgworker.Registry()
    started = anyio.Event()

    @registry.task("t")
    async def handle(ctx, payload):
        started.set()
        await anyio.sleep(0.2)

    r = await pgworker.enqueue(conn, "t", {})
    with pytest.raises(RuntimeError, match="caller failed"):
        async with pgworker.Worker(registry, dsn):
            await started.wait()
            raise RuntimeError("caller failed")
    assert (await pgworker.get_job(conn, r.job.id)).status == "completed"
    assert await conn.fetchval("SELECT count(*) FROM pgworker.workers") == 0


async def test_ctx_job_is_the_row_as_the_claim_left_it(dsn, conn):
    registry = pgworker.Registry()
    seen: dict[str, object] = {}

    @registry.task("t")
    async def handle(ctx, payload):
        seen["job"] = ctx.job
        seen["stored"] = await pgworker.get_job(conn, ctx.job_id)

    first = await pgworker.enqueue(
        conn, "t", {"n": [1, "x"]}, priority="high", idempotency_key="k-1", correlation_id="c-1"
    )
    await conn.execute(
        "UPDATE pgworker.jobs SET progress = $2, error = 'Boom: earlier' WHERE id = $1",
        first.job.id,
        '{"step": 2}',
    )
    async with pgworker.Worker(registry, dsn, lease=30) as worker:
        await wait_for(lambda: "stored" in seen)
    job, stored = seen["job"], seen["stored"]
    assert job == stored
    assert (job.status, job.worker_id, job.attempts, job.payload) == (
        "running",
        worker.worker_id,
        1,
        {"n": [1, "x"]},
    )
    assert (job.progress, job.error, job.priority) == ({"step": 2}, "Boom: earlier", 20)
    assert (job.idempotency_key, job.correlation_id) == ("k-1", "c-1")
    assert job.lease_expires_at - job.claimed_at == timedelta(seconds=30)


async def test_nul_characters_in_errors_and_results_do_not_block_outcomes(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("fails", max_retries=0)
    async def fails(ctx, payload):
        raise pgworker.PermanentError("bad\x00byte")

    @registry.task("returns")
    async def returns(ctx, payload):
        return {"s": "a\x00b"}

    failed = await pgworker.enqueue(conn, "fails", {})
    returned = await pgworker.enqueue(conn, "returns", {})
    async with pgworker.Worker(registry, dsn):
        await wait_for(lambda: all_finished(conn))
    job = await pgworker.get_job(conn, failed.job.id)
    assert (job.status, job.error) == ("failed", "PermanentError: bad\\x00byte")
    job = await pgworker.get_job(conn, returned.job.id)
    assert (job.status, job.result) == ("completed", None)


# --- a result that is not JSON ---------------------------------------------------------------


async def outcomes(conn, job_id: int) -> list[str]:
    return [a["outcome"] for a in await attempts(conn, job_id)]


async def test_a_result_that_is_not_json_completes_the_job_without_it(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("t")
    async def handle(ctx, payload):
        return {"at": datetime.now(UTC)}

    r = await pgworker.enqueue(conn, "t", {})
    with capture_logs() as logs:
        async with pgworker.Worker(registry, dsn):
            await wait_for(lambda: all_finished(conn))
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.result, job.error) == ("completed", None, None)
    assert await outcomes(conn, r.job.id) == ["completed"]
    warnings = [e for e in logged(logs, "result", job_id=r.job.id) if e["log_level"] == "warning"]
    assert warnings, logs
