"""Leases, rescue, fencing, cancellation, poll-only mode and lost connections, in-process."""

from __future__ import annotations

import struct
import time
from typing import Any

import anyio
import asyncpg
import pytest
from structlog.testing import capture_logs

import pgworker
from pgworker import RetryPolicy
from pgworker._db import files
from pgworker._db.connection import create_pool
from pgworker._db.queries import queries
from pgworker._runtime import notifier
from pgworker.models import AttemptResult, JobStatus, Outcome

from .helpers import (
    UPDATES_ATTEMPTS,
    PgProxy,
    all_finished,
    attempts,
    fake_claim,
    logged,
    status_of,
    wait_for,
)
from .webserver import (
    Served,
    server,  # noqa: F401  (the fixture)
)

Q = queries("pgworker")

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_long_job_under_a_live_worker_is_never_rescued(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("long")
    async def long(ctx, payload):
        await anyio.sleep(10)

    r = await pgworker.enqueue(conn, "long", {})
    async with pgworker.Worker(registry, dsn, lease=2.0):
        await wait_for(lambda: all_finished(conn), timeout=30)
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.attempts, job.retry_count) == ("completed", 1, 0)
    assert [a["outcome"] for a in await attempts(conn, r.job.id)] == ["completed"]


async def test_expired_lease_is_rescued_and_the_job_runs_again(dsn, conn):
    registry = pgworker.Registry()
    runs = []

    @registry.task("t")
    async def handle(ctx, payload):
        runs.append(ctx.attempt)

    again = await pgworker.enqueue(conn, "t", {"n": 1})
    out_of_retries = await pgworker.enqueue(conn, "t", {"n": 2}, max_retries=0)
    await fake_claim(conn, again.job.id)
    await fake_claim(conn, out_of_retries.job.id)
    async with pgworker.Worker(registry, dsn, lease=1.0, poll_interval=0.1):
        await wait_for(lambda: all_finished(conn))
    job = await pgworker.get_job(conn, again.job.id)
    assert (job.status, job.retry_count, job.attempts) == ("completed", 1, 2)
    assert job.error is None  # completed: the lost attempt's reason stays in its row
    rows = await attempts(conn, job.id)
    assert [a["outcome"] for a in rows] == ["lost", "completed"]
    assert rows[0]["error_message"] == "worker ghost stopped renewing its lease"
    job = await pgworker.get_job(conn, out_of_retries.job.id)
    assert (job.status, job.retry_count) == ("failed", 0)
    assert "WorkerLost" in job.error
    assert runs == [2]


async def test_each_duty_of_the_leader_is_a_service_of_its_own_at_its_interval(dsn, pool):
    """Maintenance is the leadership's renewal and one service per duty, each at the interval
    the docs give (not a count of ticks); a duty waits while another worker leads, and runs as
    soon as this one does."""
    from pgworker._logs import get_logger
    from pgworker._maintenance.maintenance import Maintenance

    def intervals(lease: float) -> dict[str, float]:
        m = Maintenance(pool, pgworker.Settings(dsn=dsn, lease=lease))
        return {s.name: s.every if hasattr(s, "every") else s.duty.every for s in m.services}

    assert intervals(30) == {
        "maintenance": 5.0,
        "rescue": 5.0,
        "retention": 300.0,
        "prune": 300.0,
        "rollup": 30.0,
        "bulk": 5.0,
    }
    assert intervals(2)["maintenance"] == intervals(2)["rescue"] == 1.0

    job = (await pgworker.enqueue(pool, "t", {})).job.id
    await fake_claim(pool, job)  # its lease expired a second ago
    await pool.execute(
        "INSERT INTO pgworker.leader (name, worker_id, expires_at) "
        "VALUES ('maintenance', 'someone-else', now() + interval '1 hour')"
    )
    m = Maintenance(pool, pgworker.Settings(dsn=dsn, worker_id="follower", lease=2))
    async with anyio.create_task_group() as tg:
        tg.start_soon(m.run, get_logger(worker_id="follower"))
        await wait_for(lambda: m.health.as_dict()["last_success"] is not None)
        assert not m.leading and m.health.state == "ok"
        assert await status_of(pool, job) == "running" and m.rescued == 0
        await pool.execute("DELETE FROM pgworker.leader")
        await wait_for(lambda: m.rescued == 1, timeout=10)
        assert await status_of(pool, job) == "pending"
        tg.cancel_scope.cancel()
    assert m.health.state == "stopped"


async def test_only_the_leader_rescues_even_when_it_lost_the_lease_after_renewing(dsn, pool):
    """The rescue is fenced by the leadership in its own statement, not only by the renewal
    before it: a worker that does not lead, and one whose lease another worker took between
    its renewal and its rescue (a pause longer than the lease), rescue nothing."""
    from pgworker._maintenance.maintenance import Maintenance

    job = (await pgworker.enqueue(pool, "t", {})).job.id
    await fake_claim(pool, job)  # its lease expired a second ago
    follower = Maintenance(pool, pgworker.Settings(dsn=dsn, worker_id="follower"))
    await pool.execute(
        "INSERT INTO pgworker.leader (name, worker_id, expires_at) "
        "VALUES ('maintenance', 'someone-else', now() + interval '1 hour')"
    )
    await follower.tick()
    assert not follower.leading and follower.rescued == 0
    [row] = await Q.jobs_expired(pool, [], None)
    decision = ((row["id"], row["attempts"], row["claimed_at"]), "pending", 0.0, 1)
    assert await Q.jobs_rescue(pool, "follower", [decision]) == []
    await pool.execute("DELETE FROM pgworker.leader")

    deposed = Maintenance(pool, pgworker.Settings(dsn=dsn, worker_id="deposed"))
    renew = deposed.leadership.renew

    async def renew_then_lose_the_lease() -> bool:
        leading = await renew()
        await pool.execute("UPDATE pgworker.leader SET worker_id = 'usurper'")
        return leading

    deposed.leadership.renew = renew_then_lose_the_lease  # type: ignore[method-assign]
    await deposed.tick()
    assert deposed.rescued == 0
    assert await pool.fetchval("SELECT status FROM pgworker.jobs WHERE id = $1", job) == "running"
    assert [a["outcome"] for a in await attempts(pool, job)] == ["running"]

    deposed.leadership.renew = renew  # type: ignore[method-assign]
    await pool.execute("DELETE FROM pgworker.leader")
    await deposed.tick()  # leading, it rescues: the job was rescuable all along
    assert deposed.rescued == 1
    assert await pool.fetchval("SELECT status FROM pgworker.jobs WHERE id = $1", job) == "pending"


async def test_a_late_outcome_is_fenced(conn):
    r = await pgworker.enqueue(conn, "t", {})
    first = await fake_claim(conn, r.job.id)
    second = await fake_claim(conn, r.job.id)  # a second owner took over: attempt 2
    late = AttemptResult(r.job.id, 1, first, JobStatus.COMPLETED, Outcome.COMPLETED, '"late"')
    assert set(await Q.job_finish_many(conn, [late])) == set()
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.result, job.attempts) == ("running", None, 2)
    assert await Q.worker_heartbeat(conn, [(r.job.id, 1, first)], 30.0) == {}
    owner = AttemptResult(r.job.id, 2, second, JobStatus.COMPLETED, Outcome.COMPLETED, '"mine"')
    assert set(await Q.job_finish_many(conn, [owner])) == {r.job.id}
    assert (await pgworker.get_job(conn, r.job.id)).result == "mine"
    assert [a["outcome"] for a in await attempts(conn, r.job.id)] == ["running", "completed"]


async def test_an_attempt_whose_claim_was_lost_is_fenced(conn):
    """A claim that a server crash took back (it committed without waiting for its WAL flush)
    lets the next claim reuse its attempt number: the claim's time tells them apart."""
    r = await pgworker.enqueue(conn, "t", {})
    lost = await fake_claim(conn, r.job.id)
    await conn.execute(
        """UPDATE pgworker.jobs SET status = 'pending', attempts = 0, claimed_at = NULL,
               lease_expires_at = NULL WHERE id = $1""",
        r.job.id,
    )
    await conn.execute("DELETE FROM pgworker.job_attempts WHERE job_id = $1", r.job.id)
    current = await fake_claim(conn, r.job.id, worker_id="alive", lease_s=30)
    assert lost != current
    late = AttemptResult(r.job.id, 1, lost, JobStatus.COMPLETED, Outcome.COMPLETED, '"late"')
    assert await Q.worker_heartbeat(conn, [(r.job.id, 1, lost)], 30.0) == {}
    assert set(await Q.job_finish_many(conn, [late])) == set()
    assert await Q.attempt_outcomes(conn, [(r.job.id, 1, lost)]) == {}
    beat = await Q.worker_heartbeat(conn, [(r.job.id, 1, current)], 30.0)
    assert beat == {(r.job.id, 1): (False, True)}
    owner = AttemptResult(r.job.id, 1, current, JobStatus.COMPLETED, Outcome.COMPLETED, '"ok"')
    assert set(await Q.job_finish_many(conn, [owner])) == {r.job.id}
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.result, job.worker_id) == ("completed", "ok", "alive")
    assert await Q.attempt_outcomes(conn, [(r.job.id, 1, current)]) == {r.job.id: "completed"}


@pytest.mark.parametrize("durable", [False, True])
async def test_claims_wait_for_the_wal_flush_only_when_durable(conn, durable):
    await pgworker.enqueue(conn, "t", {})
    server_default = await conn.fetchval("SHOW synchronous_commit")
    async with conn.transaction():
        claimed = await Q.job_claim(
            conn,
            queues=["default"],
            types=["t"],
            default_max_retries=[3],
            limit=1,
            worker_id="w",
            lease=30.0,
            code_version=None,
            durable=durable,
        )
        assert len(claimed) == 1
        in_claim = await conn.fetchval("SHOW synchronous_commit")
    assert in_claim == (server_default if durable else "off")
    assert await conn.fetchval("SHOW synchronous_commit") == server_default


async def test_a_large_outcome_batch_is_written_by_key(dsn, conn):
    """A completer that fell behind writes hundreds of outcomes at once: each one is fenced on its
    own, and the worker's generic plan probes both tables by key per outcome, not a scan of the
    running jobs joined by filter (quadratic in the batch), with a few jobs running or many."""
    specs = [pgworker.JobSpec("t", {"n": i}) for i in range(5000)]
    ids = [r.job.id for r in await pgworker.enqueue_many(conn, specs)][:300]
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'completed' WHERE NOT id = ANY($1::bigint[])", ids
    )
    await conn.execute("ANALYZE pgworker.jobs")
    claims = {job_id: await fake_claim(conn, job_id) for job_id in ids}
    stale = set(ids[::7])
    batch = [
        AttemptResult(
            job_id,
            0 if job_id in stale else 1,
            claimed_at,
            JobStatus.COMPLETED,
            Outcome.COMPLETED,
            '"ok"',
        )
        for job_id, claimed_at in claims.items()
    ]
    assert set(await Q.job_finish_many(conn, batch)) == set(ids) - stale
    rows = await conn.fetch(
        """SELECT j.status, a.outcome, count(*) FROM pgworker.jobs j
           JOIN pgworker.job_attempts a ON a.job_id = j.id GROUP BY 1, 2 ORDER BY 1"""
    )
    assert [tuple(r) for r in rows] == [
        ("completed", "completed", len(ids) - len(stale)),
        ("running", "running", len(stale)),
    ]

    pool = await create_pool(dsn, size=1)
    try:
        async with pool.acquire() as c:
            await c.execute(
                "PREPARE w(bigint[], integer[], text[], text[], text[], text[], text[], "
                "float8[], integer[], timestamptz[], text[], float8[]) AS "
                + files.queries("pgworker")["job_finish_many"]
            )
            plan = "\n".join(
                r[0]
                for r in await c.fetch(
                    "EXPLAIN (COSTS OFF) EXECUTE w('{1}', '{1}', '{completed}', '{completed}', "
                    "'{null}', '{null}', '{null}', '{0}', '{0}', '{2026-01-01Z}', '{null}', '{0}')"
                )
            )
            await c.execute("DEALLOCATE w")
    finally:
        await pool.close()
    assert "Index Cond: (id = ANY (ARRAY[o.id]))" in plan
    assert "Index Cond: ((job_id = ANY (ARRAY[d.id])) AND (attempt = d.attempts))" in plan
    assert "Join Filter" not in plan and "ANY ($1)" not in plan


@pytest.mark.parametrize("listen", [True, False])
async def test_cancel_pending_running_and_finished_jobs(dsn, conn, listen):
    registry = pgworker.Registry()
    started = anyio.Event()
    cancelled_at: list[float] = []

    @registry.task("slow", max_retries=5)
    async def slow(ctx, payload):
        started.set()
        try:
            await anyio.sleep(3600)
        finally:
            cancelled_at.append(time.monotonic())

    @registry.task("quick")
    async def quick(ctx, payload):
        pass

    pending = await pgworker.enqueue(conn, "quick", {}, delay=3600)
    assert await pgworker.cancel(conn, pending.job.id) == "cancelled"
    job = await pgworker.get_job(conn, pending.job.id)
    assert job.status == "cancelled" and job.finished_at is not None

    running = await pgworker.enqueue(conn, "slow", {})
    # Without LISTEN the request reaches the worker with its next heartbeat (a third of the lease).
    # The handler sleeps an hour and the lease is renewed meanwhile: only the cancel request ends
    # it within the bound, however slow the machine.
    async with pgworker.Worker(registry, dsn, listen=listen, lease=1.5, poll_interval=0.1):
        await started.wait()
        assert await pgworker.cancel(conn, running.job.id) == "cancelling"
        await wait_for(lambda: all_finished(conn), timeout=60)
        assert len(cancelled_at) == 1
    job = await pgworker.get_job(conn, running.job.id)
    assert (job.status, job.retry_count) == ("cancelled", 0)
    assert [a["outcome"] for a in await attempts(conn, job.id)] == ["cancelled"]
    assert await pgworker.cancel(conn, running.job.id) == "already cancelled"
    with pytest.raises(pgworker.ValidationError, match="no job"):
        await pgworker.cancel(conn, 10**9)


async def test_poll_only_mode_serves_jobs(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("t")
    async def handle(ctx, payload):
        return payload

    await pgworker.enqueue_many(conn, [pgworker.JobSpec("t", {"n": n}) for n in range(20)])
    async with pgworker.Worker(registry, dsn, listen=False, poll_interval=0.05):
        await wait_for(lambda: all_finished(conn))
    assert (
        await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE status = 'completed'") == 20
    )


async def test_terminated_backends_do_not_stop_the_worker(dsn, conn, pool):
    registry = pgworker.Registry()
    done: set[int] = set()

    @registry.task("t")
    async def handle(ctx, payload):
        await anyio.sleep(0.01)
        done.add(payload["n"])

    # A claim whose reply is lost with its connection is rescued when its lease expires.
    async with pgworker.Worker(registry, dsn, poll_interval=60.0, concurrency=4, lease=2.0):
        await pgworker.enqueue_many(pool, [pgworker.JobSpec("t", {"n": n}) for n in range(50)])
        await wait_for(lambda: len(done) >= 10)
        killed = await conn.fetchval(
            """SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
               WHERE application_name LIKE 'pgworker%' AND datname = current_database()"""
        )
        assert killed >= 3  # pool, listener and maintenance connections
        await wait_for(lambda: all_finished(conn), timeout=60)
        # The listener came back (it listens again: LISTEN is its first statement), and a new job
        # starts long before the next poll could take it (60 s): woken by its notification.
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 1 FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name LIKE 'pgworker-listen:%' AND query <> ''"
            ),
            timeout=60,
        )
        await pgworker.enqueue(pool, "t", {"n": 1000})
        await wait_for(lambda: 1000 in done, timeout=20)
    assert (
        await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE status = 'completed'") == 51
    )


async def test_an_uncertain_batch_is_checked_on_the_shared_connection(dsn, conn):
    """After a write lost with its connection, the completer asks which of the outcomes it could
    not write had committed. A worker's pool holds two connections, both kept by their users
    (the claims', and the shared one): asking the pool for a third waited forever, and every
    later outcome of the worker with it (seen in `make scale` after a silent cut)."""
    from pgworker._runtime.completer import Completer

    r = await pgworker.enqueue(conn, "t", {})
    first = await fake_claim(conn, r.job.id)
    await fake_claim(conn, r.job.id)  # rescued and claimed again: attempt 1 no longer holds it
    pool = await create_pool(dsn, size=2)
    try:
        claims = await pool.acquire()  # held by the producer, as in a worker
        try:
            completer = Completer(pool, "pgworker", "w")
            await completer.shared.fetchval("SELECT 1")  # the shared connection, kept
            late = AttemptResult(r.job.id, 1, first, JobStatus.COMPLETED, Outcome.COMPLETED)
            # The state a write lost with its connection leaves: the batch in flight, and
            # whether it committed unknown.
            completer._batch, completer._uncertain = [late], True
            with anyio.fail_after(10):
                await completer.step()
            assert completer.dropped == 1
        finally:
            await pool.release(claims)
            await completer.shared.drop()
    finally:
        await pool.close()


# --- promises of the README about cancels, leases, the listener and lost replies -------------


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


# --- a heartbeat that could not extend the lease ---------------------------------------------


async def test_a_heartbeat_that_could_not_extend_the_lease_says_so(
    server: Served,  # noqa: F811  (the fixture imported above)
    conn: Any,
    dsn: str,
) -> None:
    """Another session holds the job's row locked: the heartbeat skips it (as the Python
    worker's does), and answered 200 with the claim's lease, as if extended. Now: 503 with
    Retry-After, nothing changed; once the lock is gone, 200 and the lease extended."""
    async with server.client(timeout=60) as c:
        await c.post("/jobs", json={"type": "beat", "payload": {}})
        claimed = (
            await c.post("/jobs/claim", json={"worker_id": "w", "types": ["beat"], "lease": 5})
        ).json()
        body = {"worker_id": "w", "attempt": claimed["attempt"], "lease": 600}
        path = f"/jobs/{claimed['id']}/heartbeat"
        lease = "SELECT lease_expires_at, heartbeat_at FROM pgworker.jobs WHERE id = $1"
        before = await conn.fetchrow(lease, claimed["id"])
        other = await asyncpg.connect(dsn)
        try:
            async with other.transaction():
                await other.execute(
                    "SELECT FROM pgworker.jobs WHERE id = $1 FOR UPDATE", claimed["id"]
                )
                beat = await c.post(path, json=body)
                assert beat.status_code == 503, beat.text
                assert beat.headers["Retry-After"] == "2"
                assert "lease was not extended" in beat.json()["error"]
        finally:
            await other.close()
        assert await conn.fetchrow(lease, claimed["id"]) == before
        beat = await c.post(path, json=body)
        assert beat.status_code == 200, beat.text
        assert beat.json()["lease_expires_at"] > claimed["lease_expires_at"]
