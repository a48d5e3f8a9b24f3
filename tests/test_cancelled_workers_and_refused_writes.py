"""A worker cancelled from outside, or forked, hands its running jobs back; an outcome, a
heartbeat or a rescue the database refuses for one job (a trigger, a row an operator locked)
holds up no other job (slots as tasks of their own, abandoned handlers, lock_timeout, the
leadership lease, refused outcomes written row by row). Each test states what a mature job
queue does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

import anyio
import asyncpg
import pytest

import pgworker
from pgworker import Worker

from . import helpers
from .helpers import all_finished, attempts, has_status, serves_on, status_of, wait_for
from .test_chaos import Workers

pytestmark = pytest.mark.asyncio(loop_scope="session")

registry = pgworker.Registry()
started: dict[int, anyio.Event] = {}
release = {"event": anyio.Event()}


@registry.task("plain")
async def plain(ctx: pgworker.JobContext, payload: Any) -> Any:
    return payload


@registry.task("sleeps", max_retries=0)
async def sleeps(ctx: pgworker.JobContext, payload: Any) -> str:
    """Runs until stopped (or `payload["s"]` seconds)."""
    await asyncio.sleep(payload.get("s", 3600))
    return "slept"


@registry.task("cleanup-fails", max_retries=0)
async def cleanup_fails(ctx: pgworker.JobContext, payload: Any) -> None:
    """A handler whose cleanup raises when it is stopped (a connection closed under it, a
    rollback that fails): what it raises is not its cancellation."""
    try:
        await asyncio.sleep(3600)
    finally:
        raise ConnectionResetError("cleanup failed")


stray: dict[str, Any] = {}


@registry.task("arms-stray-cancel", max_retries=0)
async def arms_stray_cancel(ctx: pgworker.JobContext, payload: Any) -> str:
    """Leaves a background task that cancels, a little later, the task this handler ran in
    (a watchdog meant for this job, outliving it)."""
    me = asyncio.current_task()
    assert me is not None

    async def watchdog() -> None:
        await stray["armed"].wait()
        me.cancel()

    stray["task"] = asyncio.get_running_loop().create_task(watchdog())
    return "done"


@registry.task("innocent", max_retries=0)
async def innocent(ctx: pgworker.JobContext, payload: Any) -> str:
    stray["armed"].set()
    await asyncio.sleep(0.2)
    return "fine"


def serving(dsn: str, **options: Any) -> contextlib.AbstractAsyncContextManager[Worker]:
    return helpers.serving_guarded(registry, dsn, **options)


async def outcomes(conn: asyncpg.Connection, job_id: int) -> list[str]:
    return [r["outcome"] for r in await attempts(conn, job_id)]


# --- the caller cancels the worker ---------------------------------------------------------------


async def test_a_worker_cancelled_from_outside_hands_its_running_jobs_back(dsn, conn):
    """`async with Worker` inside the caller's timeout (or a task group cancelled around it): the
    running jobs are handed back as at any stop, `pending` and `interrupted`, not left `running`
    until their lease runs out and then charged a retry (or failed) as `lost`."""
    jobs = [await pgworker.enqueue(conn, "sleeps", {"n": n}) for n in range(2)]
    with anyio.fail_after(60):
        with anyio.CancelScope() as callers_timeout:
            async with Worker(registry, dsn, poll_interval=0.05, concurrency=4):
                await wait_for(
                    lambda: conn.fetchval(
                        "SELECT count(*) = 2 FROM pgworker.jobs WHERE status = 'running'"
                    ),
                    timeout=30,
                )
                callers_timeout.deadline = anyio.current_time()  # it runs out now
                await anyio.sleep(3600)
        assert callers_timeout.cancelled_caught
    for r in jobs:
        assert await status_of(conn, r.job.id) == "pending"
        assert await outcomes(conn, r.job.id) == ["interrupted"]


async def test_a_worker_run_task_cancelled_hands_its_running_jobs_back(dsn, conn):
    r = await pgworker.enqueue(conn, "sleeps", {})
    worker = Worker(registry, dsn, poll_interval=0.05)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await wait_for(lambda: has_status(conn, r.job.id, "running"))
            tg.cancel_scope.cancel()
    assert await status_of(conn, r.job.id) == "pending"
    assert await outcomes(conn, r.job.id) == ["interrupted"]
    # and its leadership and its row in `workers` are given up, as at any stop
    assert not await conn.fetchval("SELECT count(*) FROM pgworker.leader")


# --- what a handler raises while it is stopped ------------------------------------------------


async def test_a_handler_whose_cleanup_raises_at_shutdown_is_handed_back(dsn, conn):
    """Shutdown stopped the handler; its cleanup raised something else on the way out. The job
    was stopped by the worker: `pending`, `interrupted`, not counted as a retry, and never
    `failed` (max_retries=0) because of a deploy."""
    r = await pgworker.enqueue(conn, "cleanup-fails", {})
    async with serving(dsn, shutdown_timeout=0) as worker:
        await wait_for(lambda: has_status(conn, r.job.id, "running"))
        worker.interrupt()
    job = await pgworker.get_job(conn, r.job.id)
    assert job is not None
    assert (job.status, job.retry_count) == ("pending", 0), job.error
    assert await outcomes(conn, r.job.id) == ["interrupted"]


# --- a handler's leftover task cancels its slot later ---------------------------------------------


async def test_a_stray_cancel_of_a_slot_does_not_fail_the_next_job_on_it(dsn, conn):
    """Job A leaves a watchdog task that cancels A's task later, while job B (innocent) runs on
    the same slot. B did nothing wrong: it completes (or at worst is handed back), it is not
    recorded as failed with a CancelledError it never raised."""
    stray["armed"] = anyio.Event()
    a = await pgworker.enqueue(conn, "arms-stray-cancel", {})
    async with serving(dsn, concurrency=1) as worker:
        await wait_for(lambda: has_status(conn, a.job.id, "completed"))
        b = await pgworker.enqueue(conn, "innocent", {})
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status NOT IN ('pending', 'running') FROM pgworker.jobs WHERE id = $1",
                b.job.id,
            )
        )
        job = await pgworker.get_job(conn, b.job.id)
        assert job is not None
        assert job.status == "completed", job.error
        await serves_on(conn)
        assert worker.health()["producer"]["state"] == "ok"


# --- the database refuses, in ways other than a constraint ---------------------------------------


async def test_a_trigger_raising_on_one_outcome_does_not_stall_the_others(dsn, conn):
    """A trigger of the user's raises (plain `RAISE EXCEPTION`, SQLSTATE P0001) on one job's
    outcome. That row is refused as a CHECK constraint's would be: the other outcomes of its
    batch and every later one are written, the refused one is recorded as `OutcomeRefused`."""
    await conn.execute(
        """CREATE FUNCTION public.no_poison() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN RAISE EXCEPTION 'poison may not complete'; END $$;
           CREATE TRIGGER no_poison BEFORE UPDATE ON pgworker.jobs FOR EACH ROW
           WHEN (NEW.status = 'completed' AND NEW.payload ? 'poison')
           EXECUTE FUNCTION public.no_poison()"""
    )
    poison = await pgworker.enqueue(conn, "plain", {"poison": True})
    others = await pgworker.enqueue_many(
        conn, [pgworker.JobSpec("plain", {"n": n}) for n in range(3)]
    )
    async with serving(dsn) as worker:
        for r in others:
            await wait_for(lambda r=r: has_status(conn, r.job.id, "completed"), timeout=10)
        await wait_for(lambda: has_status(conn, poison.job.id, "failed"), timeout=10)
        await serves_on(conn, timeout=10)
        assert worker.health()["completer"]["state"] == "ok"
    job = await pgworker.get_job(conn, poison.job.id)
    assert job is not None and job.error is not None
    assert job.error.startswith("OutcomeRefused"), job.error


async def test_an_outcome_refused_twice_does_not_stop_every_rescue(dsn, conn):
    """A job whose outcome and whose `OutcomeRefused` replacement are both refused (a trigger
    refusing it any final status) is left to its lease, as documented. Its rescue is refused in
    turn; that must not stop the rescue of every other job: a dead worker's job is still
    rescued."""
    await conn.execute(
        """CREATE FUNCTION public.never_final() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN RAISE EXCEPTION 'may not end' USING ERRCODE = 'check_violation'; END $$;
           CREATE TRIGGER never_final BEFORE UPDATE ON pgworker.jobs FOR EACH ROW
           WHEN (NEW.status IN ('completed', 'failed') AND NEW.payload ? 'poison')
           EXECUTE FUNCTION public.never_final()"""
    )
    poison = await pgworker.enqueue(conn, "plain", {"poison": True}, max_retries=0)
    ghost = await pgworker.enqueue(conn, "plain", {"ghost": True}, queue="elsewhere")
    async with serving(dsn, lease=2.0):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT lease_expires_at < now() - interval '1 second' FROM pgworker.jobs"
                " WHERE id = $1",
                poison.job.id,
            ),
            timeout=15,
        )
        await helpers.fake_claim(conn, ghost.job.id, lease_s=-1)
        await wait_for(lambda: has_status(conn, ghost.job.id, "pending"), timeout=10)


# --- one row held or refused takes the leases of all ----------------------------------------------


async def test_a_trigger_refusing_one_heartbeat_keeps_the_other_leases(dsn, conn):
    """A trigger refuses extending one running job's lease. The other running jobs of the
    worker keep theirs: a job whose worker is alive is never taken away."""
    await conn.execute(
        """CREATE FUNCTION public.no_renewal() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN RAISE EXCEPTION 'no renewal' USING ERRCODE = 'check_violation'; END $$;
           CREATE TRIGGER no_renewal BEFORE UPDATE ON pgworker.jobs FOR EACH ROW
           WHEN (OLD.status = 'running' AND NEW.status = 'running' AND NEW.payload ? 'poison')
           EXECUTE FUNCTION public.no_renewal()"""
    )
    await pgworker.enqueue(conn, "sleeps", {"poison": True, "s": 5})
    long = await pgworker.enqueue(conn, "sleeps", {"s": 5})
    async with serving(dsn, lease=2.0):
        await wait_for(lambda: has_status(conn, long.job.id, "running"))
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status NOT IN ('pending', 'running') FROM pgworker.jobs WHERE id = $1",
                long.job.id,
            ),
            timeout=15,
        )
    assert await status_of(conn, long.job.id) == "completed"
    assert await outcomes(conn, long.job.id) == ["completed"]


async def test_a_row_locked_by_an_operator_keeps_the_other_leases_and_outcomes(dsn, conn):
    """An operator (or the user's own code) holds one running job's row locked in a long
    transaction. The worker waits at most its lock_timeout on that row; the other jobs keep
    their leases and their outcomes are written meanwhile."""
    held = await pgworker.enqueue(conn, "sleeps", {"s": 0.5})
    quick = await pgworker.enqueue(conn, "sleeps", {"s": 0.5, "n": 1})
    long = await pgworker.enqueue(conn, "sleeps", {"s": 4})
    async with serving(dsn, lease=2.0):
        await wait_for(
            lambda: conn.fetchval("SELECT count(*) = 3 FROM pgworker.jobs WHERE status = 'running'")
        )
        locker = await asyncpg.connect(dsn)
        try:
            async with locker.transaction():
                await locker.execute(
                    "SELECT 1 FROM pgworker.jobs WHERE id = $1 FOR UPDATE", held.job.id
                )
                await wait_for(lambda: has_status(conn, quick.job.id, "completed"), timeout=5)
                await wait_for(
                    lambda: conn.fetchval(
                        "SELECT status NOT IN ('pending', 'running') FROM pgworker.jobs"
                        " WHERE id = $1",
                        long.job.id,
                    ),
                    timeout=15,
                )
        finally:
            await locker.close()
        await wait_for(lambda: all_finished(conn))
    assert await outcomes(conn, long.job.id) == ["completed"]


# --- a handler forks -----------------------------------------------------------------------------


@pytest.fixture
def procs(dsn: str, tmp_path):
    w = Workers(dsn, tmp_path, "tests.apps.hostile2")
    yield w
    for p in w.procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie waiting for its parent to reap it has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (a worker's forked children outlive it)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
    return found


@pytest.mark.parametrize("type_", ["forks", "forks-async"])
async def test_a_forked_child_that_exits_does_not_become_a_second_worker(dsn, conn, procs, type_):
    """A handler forks; the child ends with sys.exit(). In the child that SystemExit is not the
    handler's failure to record: the child is not the worker (it shares the parent's sockets),
    it must exit. The parent's job completes, and the parent serves on."""
    r = await pgworker.enqueue(conn, type_, {})
    a = procs.start("a")
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status NOT IN ('pending', 'running') FROM pgworker.jobs WHERE id = $1",
                r.job.id,
            ),
            timeout=15,
        )
        job = await pgworker.get_job(conn, r.job.id)
        assert job is not None
        assert job.status == "completed", job.error
        child = job.result["child"]
        await wait_for(lambda: not _alive(child), timeout=5)
        after = await pgworker.enqueue(conn, "work", {"n": 1})
        await wait_for(lambda: has_status(conn, after.job.id, "completed"), timeout=20)
        assert procs.stop_all() == [0]
    finally:
        for pid in _children(a.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _serve_in_a_forked_process(dsn: str, job_id: int) -> None:
    async def main() -> None:
        c = await asyncpg.connect(dsn)
        try:
            async with Worker(registry, dsn, poll_interval=0.05):
                await wait_for(lambda: has_status(c, job_id, "completed"), timeout=20)
        finally:
            await c.close()

    asyncio.run(main())


async def test_a_worker_started_in_a_forked_process_serves(dsn, conn):
    """The guard against a handler's forked child must not take a worker that a process manager
    (multiprocessing, a pre-fork server) started in a forked process for such a child."""
    import multiprocessing

    r = await pgworker.enqueue(conn, "plain", {})
    child = multiprocessing.get_context("fork").Process(
        target=_serve_in_a_forked_process, args=(dsn, r.job.id)
    )
    child.start()
    await anyio.to_thread.run_sync(child.join, 60)
    assert child.exitcode == 0
    assert await status_of(conn, r.job.id) == "completed"
