"""The worker keeps serving whatever a handler, a caller or an operator does, beyond
tests/test_poison.py's list: what a user's handler may do to the event loop, the task it runs in
and structlog's context; what a caller may do with a Worker object; what an operator may do to the
database. Each test states what a mature job queue does: the worker keeps serving, the job ends
in a documented state with a readable error, nothing is left running, shutdown ends."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import asyncpg
import pytest
import structlog

import pgworker
from pgworker import JobSpec, Worker

from . import helpers
from .helpers import (
    all_finished,
    attempts,
    cli,
    database_of,
    has_status,
    serves_on,
    status_of,
    wait_for,
)
from .test_chaos import Workers

pytestmark = pytest.mark.asyncio(loop_scope="session")

registry = pgworker.Registry()


@registry.task("plain")
async def plain(ctx: pgworker.JobContext, payload: Any) -> Any:
    return payload


class Unrepresentable:
    """A value whose repr() and str() raise (a half-initialised ORM object, a lazy proxy)."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__


@registry.task("binds-unrepresentable", max_retries=0)
async def binds_unrepresentable(ctx: pgworker.JobContext, payload: Any) -> str:
    """Binds a value into structlog's context for its own log lines, then completes."""
    structlog.contextvars.bind_contextvars(user=Unrepresentable())
    return "done"


class Abort(BaseException):
    """A BaseException of a library's own (gevent's GreenletExit, trio's Cancelled, pytest's
    outcomes are such), raised where pgworker only expects Exceptions."""


class AbortingMessage(Exception):
    def __str__(self) -> str:
        raise Abort("from __str__")


@registry.task("message-aborts", max_retries=0)
async def message_aborts(ctx: pgworker.JobContext, payload: Any) -> None:
    raise AbortingMessage()


class AbortingDict(dict):
    def items(self):  # type: ignore[override]
        raise Abort("from items()")


@registry.task("result-aborts")
async def result_aborts(ctx: pgworker.JobContext, payload: Any) -> Any:
    return AbortingDict(a=1)


@registry.task("cancels-own-task", max_retries=0)
async def cancels_own_task(ctx: pgworker.JobContext, payload: Any) -> str:
    """Cancels the task it runs in (the wrong handle: it meant a sub-task), then returns."""
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    return "done"


@registry.task("leaves-timeout-armed", max_retries=0)
async def leaves_timeout_armed(ctx: pgworker.JobContext, payload: Any) -> str:
    """Enters an asyncio.timeout by hand and never leaves it: it fires after the handler
    returned, into whatever its task runs next."""
    await asyncio.timeout(0.05).__aenter__()
    return "done"


@registry.task("leaves-scope-open", max_retries=0)
async def leaves_scope_open(ctx: pgworker.JobContext, payload: Any) -> str:
    """Enters an anyio CancelScope by hand and never leaves it."""
    anyio.CancelScope().__enter__()
    return "done"


def serving(dsn: str, **options: Any) -> contextlib.AbstractAsyncContextManager[Worker]:
    return helpers.serving_guarded(registry, dsn, **options)


async def poison_in_a_claim(dsn: str, conn: asyncpg.Connection, type_: str) -> pgworker.Job:
    return await helpers.poison_in_a_claim(serving(dsn), conn, type_)


def in_a_loop_of_its_own(scenario: Callable[[], Awaitable[None]]) -> Awaitable[None]:
    """Run `scenario` on a fresh event loop in a thread: what it breaks in its loop and tasks
    cannot reach the session's loop."""
    return anyio.to_thread.run_sync(lambda: asyncio.run(scenario()), abandon_on_cancel=True)


# --- what a handler does to structlog's context ---------------------------------------------


async def test_a_handler_binding_an_unrepresentable_value_still_completes(dsn, conn):
    job = await poison_in_a_claim(dsn, conn, "binds-unrepresentable")
    assert (job.status, job.result, job.error) == ("completed", "done", None)
    assert [r["outcome"] for r in await attempts(conn, job.id)] == ["completed"]


async def test_a_caller_that_bound_worker_id_in_structlog_before_starting_the_worker(dsn, conn):
    """A service binds its own `worker_id` (or `correlation_id`) for its logs, then starts an
    embedded worker in that context: the slots inherit it."""
    jobs = await pgworker.enqueue_many(conn, [JobSpec("plain", {"n": n}) for n in range(3)])
    structlog.contextvars.bind_contextvars(worker_id="web-1", correlation_id="boot")
    try:
        async with serving(dsn):
            await wait_for(lambda: all_finished(conn), timeout=10)
    finally:
        structlog.contextvars.clear_contextvars()
    for r in jobs:
        assert await status_of(conn, r.job.id) == "completed"


# --- BaseExceptions where pgworker only catches Exception --------------------------------------


async def test_an_exception_whose_message_raises_a_base_exception(dsn, conn):
    job = await poison_in_a_claim(dsn, conn, "message-aborts")
    assert job.status == "failed"
    assert job.error is not None and job.error.startswith("AbortingMessage")


async def test_a_return_value_whose_serialisation_raises_a_base_exception(dsn, conn):
    job = await poison_in_a_claim(dsn, conn, "result-aborts")
    # documented: a return value that cannot be stored leaves `result` empty
    assert (job.status, job.result) == ("completed", None)


# --- what a handler does to the task it runs in ------------------------------------------------


@pytest.mark.parametrize("type_", ["cancels-own-task", "leaves-timeout-armed"])
async def test_a_cancel_left_on_the_slot_task_does_not_stop_the_worker(dsn, conn, type_):
    poison = await pgworker.enqueue(conn, type_, {})
    async with serving(dsn, concurrency=1) as worker:
        await wait_for(lambda: has_status(conn, poison.job.id, "completed"), timeout=10)
        await anyio.sleep(0.1)  # the armed timeout's deadline passes (it is 50 ms)
        await serves_on(conn)
        assert all(h["state"] != "stopped" for h in worker.health().values())


async def test_a_cancel_scope_left_open_by_a_handler(dsn, conn):
    async def scenario() -> None:
        poison = await pgworker.enqueue(conn2 := await asyncpg.connect(dsn), "leaves-scope-open")
        try:
            with anyio.fail_after(20):
                async with Worker(registry, dsn, concurrency=1, poll_interval=0.05):
                    await wait_for(lambda: _done(conn2, poison.job.id), timeout=10)
                    await serves_on(conn2)
        finally:
            await conn2.close()

    await in_a_loop_of_its_own(scenario)
    assert await all_finished(conn)
    assert not await conn.fetchval(
        "SELECT count(*) FROM pgworker.job_attempts WHERE outcome = 'running'"
    )


async def _done(conn: asyncpg.Connection, job_id: int) -> bool:
    return await status_of(conn, job_id) in ("completed", "failed")


# --- real `pgworker run` processes ---------------------------------------------------------------


@pytest.fixture
def procs(dsn: str, tmp_path):
    w = Workers(dsn, tmp_path, "tests.apps.hostile")
    yield w
    for p in w.procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def _exits_within(proc: subprocess.Popen[bytes], seconds: float) -> Awaitable[int | None]:
    def wait() -> int | None:
        try:
            return proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    return anyio.to_thread.run_sync(wait)


async def test_a_handler_that_swallows_cancellation_does_not_hang_shutdown(dsn, conn, procs):
    r = await pgworker.enqueue(conn, "stubborn", {})
    a = procs.start("a", "--shutdown-timeout", "0.5")
    await wait_for(lambda: has_status(conn, r.job.id, "running"), timeout=30)
    a.send_signal(signal.SIGTERM)
    code = await _exits_within(a, 10)
    if code is None:  # the operator insists: a second signal hands jobs back at once
        a.send_signal(signal.SIGTERM)
        code = await _exits_within(a, 5)
    assert code == 0, "the worker did not exit after SIGTERM, nor after a second one"
    assert await status_of(conn, r.job.id) == "pending"
    assert [x["outcome"] for x in await attempts(conn, r.job.id)] == ["interrupted"]


async def test_an_exception_whose_message_calls_sys_exit(dsn, conn, procs):
    poison = await pgworker.enqueue(conn, "str-exits", {})
    a = procs.start("a")
    await wait_for(
        lambda: a.poll() is not None or _done(conn, poison.job.id),
        timeout=30,
    )
    assert a.poll() is None, "the worker process exited"
    assert await status_of(conn, poison.job.id) == "failed"
    after = await pgworker.enqueue(conn, "work", {"n": 1})
    await wait_for(lambda: has_status(conn, after.job.id, "completed"), timeout=20)
    assert procs.stop_all() == [0]


async def test_pgworker_run_survives_a_handler_cancelling_its_own_task(dsn, conn, procs):
    poison = await pgworker.enqueue(conn, "cancels-own-task", {})
    a = procs.start("a", "--concurrency", "1")
    await wait_for(lambda: _done(conn, poison.job.id), timeout=30)
    after = await pgworker.enqueue(conn, "work", {"n": 1})
    await wait_for(
        lambda: a.poll() is not None or has_status(conn, after.job.id, "completed"), timeout=20
    )
    assert a.poll() is None, "the worker process exited"
    assert procs.stop_all() == [0]


# --- calls on a Worker -------------------------------------------------------------------------


async def test_entering_a_running_worker_again_is_refused(dsn, conn):
    async def scenario() -> None:
        c = await asyncpg.connect(dsn)
        try:
            with anyio.fail_after(20):
                worker = Worker(registry, dsn, poll_interval=0.05)
                async with worker:
                    entered = False
                    with pytest.raises((pgworker.PgWorkerError, RuntimeError)):
                        async with worker:
                            entered = True
                    assert not entered, "a running worker was entered again"
                    await serves_on(c)
            # nothing of the worker remains, and this task can still use its connection
            assert not await c.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgworker%'"
                " AND datname = current_database()"
            )
        finally:
            await c.close()

    await in_a_loop_of_its_own(scenario)


async def test_a_worker_that_ran_once_serves_again(dsn, conn):
    """The README: a Worker "can be run again after it stopped". Its second run serves jobs
    and its services are all running again, then stopped again when it leaves."""
    worker = Worker(registry, dsn, poll_interval=0.05)
    with anyio.fail_after(60):
        async with worker:
            await serves_on(conn)
        assert all(h["state"] == "stopped" for h in worker.health().values())
        async with worker:
            await serves_on(conn)
            assert all(h["state"] == "ok" for h in worker.health().values()), worker.health()
        assert all(h["state"] == "stopped" for h in worker.health().values())


async def test_queues_given_as_one_string_is_a_config_error():
    with pytest.raises(pgworker.ConfigError, match="queues"):
        Worker(registry, "postgresql://u@localhost/d", queues="default")  # type: ignore[arg-type]


async def test_settings_and_keyword_options_together_is_a_config_error():
    """One of them would be silently ignored."""
    settings = pgworker.Settings(dsn="postgresql://u@localhost/d", concurrency=2)
    with pytest.raises(pgworker.ConfigError, match="settings"):
        Worker(registry, settings=settings, concurrency=4)


gate: dict[str, anyio.Event] = {}

LONG_LEASE = 60.0


@registry.task("held-elsewhere", queue="a-only")
async def held_elsewhere(ctx: pgworker.JobContext, payload: Any) -> str:
    await gate["open"].wait()
    return "done"


async def leader(conn: asyncpg.Connection) -> str | None:
    return await conn.fetchval(
        "SELECT worker_id FROM pgworker.leader WHERE name = 'maintenance' AND expires_at > now()"
    )


async def test_a_draining_worker_leaves_the_leadership_at_once(dsn, conn):
    """A stopping worker waits for its running jobs; meanwhile another worker leads (rescues
    must not wait for a long drain). The leases are 60 s: within the bound only a resignation,
    not an expiry, hands the leadership over (each worker ticks every 5 s)."""
    gate["open"] = anyio.Event()
    r = await pgworker.enqueue(conn, "held-elsewhere", {}, queue="a-only")
    try:
        with anyio.fail_after(120):
            async with serving(dsn, worker_id="a", queues=["a-only"], lease=LONG_LEASE) as a:
                await wait_for(lambda: has_status(conn, r.job.id, "running"), timeout=30)
                await wait_for(lambda: _leads(conn, "a"), timeout=30)
                async with serving(dsn, worker_id="b", lease=LONG_LEASE):
                    a.stop()
                    await wait_for(lambda: _leads(conn, "b"), timeout=LONG_LEASE / 2)
                    assert await status_of(conn, r.job.id) == "running"
                    gate["open"].set()
                    await wait_for(lambda: has_status(conn, r.job.id, "completed"))
    finally:
        gate["open"].set()


async def _leads(conn: asyncpg.Connection, worker_id: str) -> bool:
    return await leader(conn) == worker_id


async def test_a_statement_the_database_refuses_is_one_line_from_the_cli(dsn, conn):
    db_name = database_of(dsn)
    await conn.execute(f'ALTER DATABASE "{db_name}" SET default_transaction_read_only = on')
    result = cli("enqueue", "t", "--dsn", dsn)
    err = result.stderr
    assert result.returncode == 1
    assert err.startswith("pgworker enqueue: error: the database refused it:"), err
    assert "read-only" in err and "Traceback" not in err and err.count("\n") == 1


async def test_health_at_every_stage(dsn, conn):
    worker = Worker(registry, dsn, poll_interval=0.05)
    assert worker.health() == {}
    worker.stop()  # a stop asked for before the start: the worker starts, then stops at once
    async with worker:
        pass
    health = worker.health()
    assert set(health) == {"producer", "heartbeat", "completer", "maintenance", "notifier"}
    assert all(h["state"] == "stopped" for h in health.values())
    await wait_for(
        lambda: _no_sessions(conn),
        timeout=10,
    )


async def _no_sessions(conn: asyncpg.Connection) -> bool:
    return not await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgworker%'"
        " AND datname = current_database()"
    )


# --- what an operator does to the database -----------------------------------------------------


async def test_a_database_read_only_for_a_while_is_served_again(dsn, conn):
    """Failover-like: the worker's sessions are (re)opened while the database is read-only
    (`default_transaction_read_only`, as on a standby); once it is writable again, new jobs run."""
    db_name = database_of(dsn)
    async with serving(dsn) as worker:
        await serves_on(conn)
        await conn.execute(f'ALTER DATABASE "{db_name}" SET default_transaction_read_only = on')
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name LIKE 'pgworker%' AND datname = current_database()"
        )
        await wait_for(
            lambda: "read-only" in (worker.health()["producer"]["last_error"] or ""), timeout=20
        )
        await conn.execute(f'ALTER DATABASE "{db_name}" RESET default_transaction_read_only')
        await serves_on(conn, timeout=20)


async def test_a_job_whose_attempts_were_reset_does_not_stall_its_queue(dsn, conn):
    old = await pgworker.enqueue(conn, "plain", {"old": True})
    async with serving(dsn):
        await wait_for(lambda: has_status(conn, old.job.id, "completed"), timeout=10)
    # an operator runs the job again "from scratch", counters included
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'pending', attempts = 0, retry_count = 0,"
        " finished_at = NULL, run_at = now() WHERE id = $1",
        old.job.id,
    )
    others = await pgworker.enqueue_many(conn, [JobSpec("plain", {"n": n}) for n in range(3)])
    async with serving(dsn):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT bool_and(status = 'completed') FROM pgworker.jobs"
                " WHERE id = ANY($1::bigint[])",
                [r.job.id for r in others],
            ),
            timeout=10,
        )
        # the reset job itself ends in a documented state, not stuck pending
        await wait_for(lambda: _done(conn, old.job.id), timeout=10)
    # its history is kept: the new attempt is numbered after the last recorded one
    rows = await attempts(conn, old.job.id)
    assert [(r["attempt"], r["outcome"]) for r in rows] == [(1, "completed"), (2, "completed")]


async def test_health_is_honest_while_an_operator_holds_the_leader_row(dsn, conn):
    """An operator locks the `leader` row (a long transaction, a SELECT ... FOR UPDATE in psql):
    no rescue happens meanwhile, and `Worker.health()` must not say maintenance is fine."""
    async with serving(dsn, lease=1) as worker:
        await wait_for(lambda: worker.health()["maintenance"]["last_success"], timeout=30)
        async with conn.transaction():
            await conn.execute("SELECT * FROM pgworker.leader FOR UPDATE")
            # Its renewal waits on the lock (lock_timeout: a third of the lease), fails, and
            # the service says so until the lock is released.
            await wait_for(
                lambda: worker.health()["maintenance"]["state"] == "retrying", timeout=60
            )
            renewed = worker.health()["maintenance"]["last_success"]
            assert "lock" in (worker.health()["maintenance"]["last_error"] or "")
            await wait_for(
                lambda: worker.health()["maintenance"]["consecutive_failures"] >= 3, timeout=60
            )
            health = worker.health()["maintenance"]
            assert (health["state"], health["last_success"]) == ("retrying", renewed)
        await wait_for(lambda: worker.health()["maintenance"]["state"] == "ok", timeout=60)
