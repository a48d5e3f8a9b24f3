"""Promises of the README that nothing else would notice breaking: each test fails when the line
that keeps its promise is broken (the commit that added them says which line each one guards)."""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
from datetime import UTC, datetime

import anyio
import asyncpg
import pytest
import structlog
from structlog.testing import capture_logs

import pgworker
from pgworker import JobSpec, RetryPolicy
from pgworker._runtime import notifier

from .helpers import (
    ROOT,
    UPDATES_ATTEMPTS,
    PgProxy,
    all_finished,
    attempts,
    fake_claim,
    logged,
    spawn_worker,
    status_of,
    wait_for,
)
from .test_chaos import Workers, reconcile
from .test_chaos import own_cluster as _own_cluster

own_cluster = _own_cluster  # the fixture: a PostgreSQL of the test's own, to crash

pytestmark = pytest.mark.asyncio(loop_scope="session")

FAST = RetryPolicy(max_retries=3, initial_delay=0.05, max_delay=0.2, jitter=0.1)


async def outcomes(conn, job_id: int) -> list[str]:
    return [a["outcome"] for a in await attempts(conn, job_id)]


@pytest.mark.parametrize("failure", ["raises", "retry"])
async def test_a_cancel_asked_for_while_running_is_not_undone_by_a_retry(dsn, conn, failure):
    """The handler fails with retries left after its cancel was asked for but before its worker
    heard of it (no LISTEN, the next heartbeat far off): that outcome would requeue the job; the
    cancel must win."""
    registry = pgworker.Registry()
    asked = anyio.Event()
    runs: list[int] = []

    @registry.task("t", retry=FAST)
    async def handle(ctx, payload):
        runs.append(ctx.attempt)
        await asked.wait()
        if failure == "retry":
            raise pgworker.Retry(after=0)
        raise ValueError("boom")

    r = await pgworker.enqueue(conn, "t", {})
    async with pgworker.Worker(registry, dsn, listen=False, lease=60.0, poll_interval=0.05):
        await wait_for(lambda: runs)
        assert await pgworker.cancel(conn, r.job.id) == "cancelling"
        asked.set()
        await wait_for(lambda: all_finished(conn))
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, runs, job.retry_count) == ("cancelled", [1], 0)
    assert job.finished_at is not None and job.run_at <= job.finished_at
    assert await outcomes(conn, r.job.id) == ["cancelled"]


async def test_a_rescued_job_whose_cancel_was_asked_for_ends_cancelled(dsn, conn):
    """Its worker died with a cancel pending: the rescue must not give the job another run."""
    registry = pgworker.Registry()
    runs: list[int] = []

    @registry.task("t")
    async def handle(ctx, payload):
        runs.append(ctx.attempt)

    r = await pgworker.enqueue(conn, "t", {})
    await fake_claim(conn, r.job.id)  # its worker is gone, its lease over
    assert await pgworker.cancel(conn, r.job.id) == "cancelling"
    async with pgworker.Worker(registry, dsn, lease=1.0, poll_interval=0.05):
        await wait_for(lambda: all_finished(conn))
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.retry_count, runs) == ("cancelled", 0, [])
    assert await outcomes(conn, r.job.id) == ["lost"]


async def test_a_heartbeat_that_finds_the_lease_gone_stops_the_handler(dsn, conn):
    """The job was rescued and claimed again elsewhere while this attempt ran (its row now names
    another claim): the stale handler must be stopped, not left running beside the new one, and
    its outcome must not touch the job."""
    registry = pgworker.Registry()
    started = anyio.Event()
    stopped = anyio.Event()

    @registry.task("t")
    async def handle(ctx, payload):
        started.set()
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            stopped.set()
            raise

    r = await pgworker.enqueue(conn, "t", {})
    with capture_logs() as logs:
        async with pgworker.Worker(
            registry, dsn, lease=1.5, poll_interval=0.05, shutdown_timeout=1.0
        ):
            with anyio.fail_after(10):
                await started.wait()
            await conn.execute(
                """UPDATE pgworker.jobs SET attempts = attempts + 1, claimed_at = clock_timestamp(),
                       worker_id = 'other', lease_expires_at = now() + interval '1 hour'
                   WHERE id = $1""",
                r.job.id,
            )
            with anyio.fail_after(10):  # heartbeats come every half second
                await stopped.wait()
            await wait_for(lambda: logged(logs, "outcome dropped", job_id=r.job.id))
    assert logged(logs, "lease lost: stopping the attempt", job_id=r.job.id)
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.worker_id, job.attempts) == ("running", "other", 2)


async def test_structlog_context_bound_by_a_handler_does_not_reach_the_next_job(dsn, conn):
    """One slot runs both jobs: what the first binds must be gone when the second starts."""
    registry = pgworker.Registry()
    seen: dict[int, dict] = {}

    @registry.task("t")
    async def handle(ctx, payload):
        seen[ctx.job_id] = structlog.contextvars.get_contextvars()
        structlog.contextvars.bind_contextvars(leaked=ctx.job_id, job_id=-1)

    first = await pgworker.enqueue(conn, "t", {"n": 1}, priority=1)
    second = await pgworker.enqueue(conn, "t", {"n": 2})
    async with pgworker.Worker(registry, dsn, concurrency=1):
        await wait_for(lambda: all_finished(conn))
    assert list(seen) == [first.job.id, second.job.id]
    assert "leaked" not in seen[second.job.id]
    assert (seen[second.job.id]["job_id"], seen[second.job.id]["attempt"]) == (second.job.id, 1)


async def test_a_second_sigterm_hands_running_jobs_back_at_once(dsn, conn, tmp_path):
    """The grace period is ten minutes; the second signal must not wait for it."""
    r = await pgworker.enqueue(conn, "sleep", {"seconds": 3600})
    log = tmp_path / "worker.log"
    worker = spawn_worker(
        "tests.apps.basic", dsn, log, "--shutdown-timeout", "600", "--log-format", "json"
    )
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'running' FROM pgworker.jobs WHERE id = $1", r.job.id
            ),
            timeout=30,
        )
        worker.send_signal(signal.SIGTERM)
        # Two signals pending at once would be one: send the second once the first was read.
        await wait_for(lambda: "SIGTERM received" in log.read_text(), timeout=10)
        assert (await pgworker.get_job(conn, r.job.id)).status == "running"
        worker.send_signal(signal.SIGTERM)
        await wait_for(lambda: worker.poll() is not None, timeout=15)
    finally:
        worker.kill()
        worker.wait()
    assert worker.returncode == 0, log.read_text()
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.retry_count) == ("pending", 0)
    assert await outcomes(conn, r.job.id) == ["interrupted"]


async def test_registry_enqueue_fills_in_only_what_the_caller_left_out(conn):
    registry = pgworker.Registry()

    @registry.task("mail-out", queue="mail", priority="high", max_retries=5)
    async def mail_out(ctx, payload):
        pass

    async def stored(result) -> tuple:
        job = await pgworker.get_job(conn, result.job.id)
        return job.queue, job.priority, job.max_retries

    assert await stored(await registry.enqueue(conn, "mail-out", {"n": 1})) == ("mail", 20, 5)
    given = await registry.enqueue(
        conn, "mail-out", {"n": 2}, queue="bulk", priority=0, max_retries=0
    )
    assert await stored(given) == ("bulk", 0, 0)  # 0 is a value, not "none given"
    partly = await registry.enqueue(conn, "mail-out", {"n": 3}, priority="low")
    assert await stored(partly) == ("mail", 0, 5)
    with pytest.raises(pgworker.ValidationError) as unknown:  # a typo is not sent to `default`
        await registry.enqueue(conn, "unknown", {})
    assert unknown.value.field == "type"


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


async def test_a_listener_that_stops_receiving_is_replaced(dsn, conn, monkeypatch):
    """The LISTEN connection stays open but nothing reaches it any more (the proxy holds what the
    server sends it): its own ping does not come back, so the worker replaces it, and a new job
    wakes the worker at once again although its next poll is a minute away."""
    # The one reach into internals: the ping's period and patience, lowered from 5 s each.
    monkeypatch.setattr(notifier, "CHECK_EVERY", 0.2)
    monkeypatch.setattr(notifier, "CHECK_TIMEOUT", 0.5)
    registry = pgworker.Registry()
    done: list[int] = []

    @registry.task("t")
    async def handle(ctx, payload):
        done.append(payload["n"])

    async with PgProxy(dsn) as proxy:
        with capture_logs() as logs:
            async with pgworker.Worker(registry, proxy.dsn, poll_interval=60.0):
                listener = await wait_for(lambda: proxy.link("pgworker-listen"))
                listener.pause()
                await wait_for(lambda: logged(logs, "listener stopped receiving; reconnecting"))
                await wait_for(lambda: logged(logs, "listener reconnected"))
                await wait_for(listener.closed.is_set)
                await pgworker.enqueue(conn, "t", {"n": 1})
                await wait_for(lambda: done == [1], timeout=5)


async def _run_with_the_outcome_reply_lost(dsn, conn, registry) -> tuple[int, list]:
    """Enqueue one job of type "t" and serve it through a proxy that cuts the completer's
    connection once the job's outcome statement has committed, before its reply arrives; the
    job's id and the logs of the worker."""
    # An id whose 8 bytes appear in no other statement's parameters by chance.
    await conn.execute("SELECT setval(pg_get_serial_sequence('pgworker.jobs', 'id'), 7340033)")
    r = await pgworker.enqueue(conn, "t", {})
    async with PgProxy(dsn) as proxy:
        proxy.cut_after(
            lambda link, text: (
                "maintenance" not in link.application_name and bool(UPDATES_ATTEMPTS.search(text))
            ),
            struct.pack("!q", r.job.id),
        )
        with capture_logs() as logs:
            async with pgworker.Worker(registry, proxy.dsn, lease=60.0, poll_interval=0.05):
                with anyio.fail_after(30):
                    await proxy.cut_done.wait()
                await wait_for(lambda: all_finished(conn), timeout=30)
    return r.job.id, logs


async def test_an_outcome_committed_whose_reply_was_lost_counts_as_written(dsn, conn):
    """The completer's write commits on the server, then its connection dies before the reply
    arrives. Written again on a new connection, the outcome is refused (the job is no longer
    running): the completer must find it recorded, not call it dropped."""
    registry = pgworker.Registry()
    runs: list[int] = []

    @registry.task("t")
    async def handle(ctx, payload):
        runs.append(ctx.attempt)
        return {"ok": True}

    job_id, logs = await _run_with_the_outcome_reply_lost(dsn, conn, registry)
    job = await pgworker.get_job(conn, job_id)
    assert (job.status, job.result, runs) == ("completed", {"ok": True}, [1])
    assert await outcomes(conn, job_id) == ["completed"]
    assert not logged(logs, "outcome dropped")
    [stopped] = logged(logs, "worker stopped")
    assert (stopped["outcomes_written"], stopped["outcomes_dropped"]) == (1, 0)


async def test_a_failure_ended_cancelled_whose_reply_was_lost_counts_as_written(dsn, conn):
    """As above, for a handler that fails after an operator asked to cancel its job: the database
    records the attempt `cancelled`, not `failed` as sent (job_finish_many.sql); the completer
    that lost the reply must still find it recorded."""
    registry = pgworker.Registry()
    asked = anyio.Event()

    @registry.task("t")
    async def handle(ctx, payload):
        await conn.execute(
            "UPDATE pgworker.jobs SET cancel_requested_at = now() WHERE id = $1", ctx.job_id
        )
        asked.set()
        raise pgworker.PermanentError("gave up")

    job_id, logs = await _run_with_the_outcome_reply_lost(dsn, conn, registry)
    assert asked.is_set()
    assert await status_of(conn, job_id) == "cancelled"
    assert await outcomes(conn, job_id) == ["cancelled"]
    assert not logged(logs, "outcome dropped")
    [stopped] = logged(logs, "worker stopped")
    assert (stopped["outcomes_written"], stopped["outcomes_dropped"]) == (1, 0)


async def test_postgres_crashing_mid_run_loses_no_job_and_stops_no_worker(own_cluster, tmp_path):
    """The soak's server crash, short: an immediate stop (claims that had not reached the disk
    are undone, their late outcomes fenced), then a restart."""
    dsn = own_cluster.dsn
    conn = await asyncpg.connect(dsn)
    await pgworker.migrate(conn)
    total = 300
    await pgworker.enqueue_many(
        conn, [JobSpec("work", {"n": n, "ms": 40, "claim": True}) for n in range(total)]
    )
    workers = Workers(dsn, tmp_path)
    try:
        procs = [workers.start(name, "--lease", "2", "--concurrency", "5") for name in "ab"]
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) >= 60 FROM pgworker.jobs WHERE status = 'completed'"
            ),
            timeout=30,
        )
        left = await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE status IN ('pending', 'running')"
        )
        assert left > 50  # the crash comes mid-run
        await conn.close()
        own_cluster.stop("immediate")
        own_cluster.start()
        conn = await asyncpg.connect(dsn)
        await wait_for(lambda: all_finished(conn), timeout=40)
        assert [p.poll() for p in procs] == [None, None]  # no worker exited
        assert workers.stop_all() == [0, 0]
        await reconcile(conn, total)
        completed_twice = await conn.fetchval(
            """SELECT count(*) FROM (SELECT job_id FROM pgworker.job_attempts
                   WHERE outcome = 'completed' GROUP BY job_id HAVING count(*) > 1) AS d"""
        )
        assert completed_twice == 0
        # A late outcome of a claim the crash undid must not complete the job's next claim.
        not_by_its_claim = await conn.fetchval(
            """SELECT count(*) FROM pgworker.jobs
               WHERE (result->>'claimed_at')::timestamptz IS DISTINCT FROM claimed_at"""
        )
        assert not_by_its_claim == 0
        assert "listener reconnected" in workers.log("a") + workers.log("b")
    finally:
        for p in workers.procs:
            if p.poll() is None:
                p.kill()
        await conn.close()


async def test_the_demo_checks_what_it_shows(dsn):
    """`make run` exits non-zero when a job of the demo ends otherwise than the README says."""
    out = subprocess.run(
        [sys.executable, "examples/demo.py"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PGWORKER_DSN": dsn, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every job ended as expected" in out.stdout
