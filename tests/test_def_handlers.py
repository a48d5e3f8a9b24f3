"""Plain `def` handlers on a par with `async def` ones: `ctx.step`,
`ctx.transactional_step` (with a synchronous connection) and `ctx.progress` block the handler's
thread and return their value; `ctx.stopping` is set as soon as the worker asks an attempt to
stop (SIGTERM's grace period, an operator's cancel, the task's timeout), on async handlers too."""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import threading
import time
from typing import Any

import anyio
import pytest

import pgworker

from .helpers import has_status, serving_guarded, spawn_worker, status_of, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

FAST = pgworker.RetryPolicy(max_retries=3, initial_delay=0.05)


async def step_rows(conn: Any, job_id: int) -> list[tuple[str, Any, int]]:
    rows = await conn.fetch(
        "SELECT name, result, attempt FROM pgworker.job_steps WHERE job_id = $1 ORDER BY name",
        job_id,
    )
    return [(r["name"], json.loads(r["result"]), r["attempt"]) for r in rows]


async def milestones(conn: Any, job_id: int) -> list[tuple[int, str, Any]]:
    rows = await conn.fetch(
        "SELECT attempt, milestone, detail FROM pgworker.job_milestones WHERE job_id = $1 "
        "ORDER BY seq",
        job_id,
    )
    return [(r["attempt"], r["milestone"], r["detail"] and json.loads(r["detail"])) for r in rows]


# --- steps and milestones ------------------------------------------------------------------------


async def test_a_def_handler_steps_and_milestones_return_their_values(dsn, conn):
    """The first attempt runs both steps, reports a milestone and fails; the retry gets the
    steps' stored results without running them again and reports its own milestone."""
    registry = pgworker.Registry()
    calls: list[str] = []

    def fetch(n: int) -> dict[str, Any]:
        calls.append("fetch")
        return {"n": n, "thread": threading.current_thread().name}

    async def fetch_async(n: int) -> int:
        calls.append("fetch_async")
        return n * 2

    @registry.task("work", retry=FAST)
    def work(ctx: pgworker.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
        first = ctx.step("fetch", fetch, payload["n"])
        second = ctx.step("double", fetch_async, payload["n"])
        assert ctx.progress("fetched", {"attempt": ctx.attempt}) is None
        if ctx.attempt == 1:
            raise RuntimeError("fails after its steps")
        return {"first": first, "second": second, "last": ctx.last_progress}

    r = await pgworker.enqueue(conn, "work", {"n": 21})
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, r.job.id, "completed"))
    assert calls == ["fetch", "fetch_async"]  # each once: the retry got them back
    job = await pgworker.get_job(conn, r.job.id)
    assert job is not None and job.attempts == 2
    assert job.result["first"]["n"] == 21 and job.result["second"] == 42
    assert job.result["last"]["milestone"] == "fetched"  # the first attempt's
    assert [(name, attempt) for name, _, attempt in await step_rows(conn, r.job.id)] == [
        ("double", 1),
        ("fetch", 1),
    ]
    assert await milestones(conn, r.job.id) == [
        (1, "fetched", {"attempt": 1}),
        (2, "fetched", {"attempt": 2}),
    ]
    progress = await conn.fetchval("SELECT progress FROM pgworker.jobs WHERE id = $1", r.job.id)
    assert json.loads(progress)["detail"] == {"attempt": 2}


async def test_a_def_handler_transactional_step_commits_or_rolls_back_with_its_effect(dsn, conn):
    """A plain function gets a synchronous connection: its writes and the step's checkpoint
    commit together; one that raises leaves neither; transaction control is refused; a
    savepoint rolls back alone; an async function gets the asynchronous connection."""
    await conn.execute("CREATE TABLE effects (n int, how text)")
    registry = pgworker.Registry()
    seen: list[str] = []

    def write(db: Any, n: int) -> int:
        db.execute("INSERT INTO effects VALUES ($1, 'sync')", n)
        try:
            with db.transaction():
                db.execute("INSERT INTO effects VALUES (-1, 'savepoint')")
                raise KeyError("rolled back to the savepoint")
        except KeyError:
            pass
        db.executemany("INSERT INTO effects VALUES ($1, 'many')", [(n + 1,), (n + 2,)])
        return int(db.fetchval("SELECT count(*) FROM effects"))

    def fails(db: Any) -> None:
        db.execute("INSERT INTO effects VALUES (100, 'fails')")
        raise ValueError("after its write")

    def commits(db: Any) -> None:
        db.execute("COMMIT")

    async def write_async(db: Any) -> str:
        return str(await db.execute("INSERT INTO effects VALUES (7, 'async')"))

    @registry.task("tx", retry=FAST)
    def tx(ctx: pgworker.JobContext, payload: Any) -> list[Any]:
        try:
            ctx.transactional_step("fails", fails)
        except ValueError:
            seen.append("fails raised")
        try:
            ctx.transactional_step("commits", commits)
        except pgworker.ValidationError as exc:
            seen.append(f"refused: {exc.field}")
        try:  # a milestone inside the step's function would not commit with its effect
            ctx.transactional_step("nested", lambda db: ctx.progress("inside"))
        except pgworker.PgWorkerError as exc:
            seen.append("nested: " + str(exc).split(" called")[0])
        return [ctx.transactional_step("write", write, 1), ctx.transactional_step("a", write_async)]

    r = await pgworker.enqueue(conn, "tx", {})
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, r.job.id, "completed"))
    assert seen == ["fails raised", "refused: fn", "nested: progress 'inside'"]
    job = await pgworker.get_job(conn, r.job.id)
    assert job is not None and job.result == [3, "INSERT 0 1"]
    rows = await conn.fetch("SELECT n, how FROM effects ORDER BY n")
    assert [(x["n"], x["how"]) for x in rows] == [
        (1, "sync"),
        (2, "many"),
        (3, "many"),
        (7, "async"),
    ]
    assert [name for name, _, _ in await step_rows(conn, r.job.id)] == ["a", "write"]


# --- ctx.stopping ---------------------------------------------------------------------------------


async def test_sigterm_sets_stopping_and_a_def_handler_returns_within_the_grace_period(
    dsn, conn, tmp_path
):
    """A real `pgworker run`: on SIGTERM the handler's loop on ctx.stopping ends at once, its job
    completes with what it returned, and the process exits 0 long before the grace period
    ends (which would have handed the job back as interrupted)."""
    grace = 20.0
    r = await pgworker.enqueue(conn, "loop", {})
    log = tmp_path / "worker.log"
    worker = spawn_worker("tests.apps.defs", dsn, log, "--shutdown-timeout", str(grace))
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT progress->>'milestone' = 'looping' FROM pgworker.jobs WHERE id = $1",
                r.job.id,
            ),
            timeout=30,
        )
        sent = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = await anyio.to_thread.run_sync(lambda: worker.wait(timeout=grace + 10))
        took = time.monotonic() - sent
    finally:
        worker.kill()
    assert code == 0, log.read_text()
    assert took < grace / 2, f"exited {took:.1f}s after SIGTERM: the handler did not see it"
    job = await pgworker.get_job(conn, r.job.id)
    assert job is not None and job.status == "completed", (job, log.read_text())
    assert job.result["stopped"] is False  # asked to stop, not stopped: it returned itself
    assert [name for name, _, _ in await step_rows(conn, r.job.id)] == ["started"]


def _def_waits(seen: queue.SimpleQueue[Any]) -> Any:
    def handler(ctx: pgworker.JobContext, payload: Any) -> None:
        flag = ctx.stopping  # read before the stop: set by it
        seen.put("running")
        started = time.monotonic()
        while not flag.wait(0.05):
            if time.monotonic() - started > 30:
                seen.put("never set")
                return
        seen.put(("set", ctx.stopped))

    return handler


def _async_waits(seen: queue.SimpleQueue[Any]) -> Any:
    async def handler(ctx: pgworker.JobContext, payload: Any) -> None:
        flag = ctx.stopping
        # A thread of the handler's own waits on the flag; the handler itself is cancelled.
        threading.Thread(target=lambda: seen.put(("thread", flag.wait(30))), daemon=True).start()
        seen.put("running")
        try:
            await anyio.sleep(60)
        except asyncio.CancelledError:
            seen.put(("cancelled", ctx.stopping.is_set()))
            raise

    return handler


async def _got(seen: queue.SimpleQueue[Any], timeout: float = 15.0) -> Any:
    return await anyio.to_thread.run_sync(lambda: seen.get(timeout=timeout))


@pytest.mark.parametrize("kind", ["def", "async"])
async def test_stopping_is_set_by_an_operators_cancel(dsn, conn, kind):
    registry = pgworker.Registry()
    seen: queue.SimpleQueue[Any] = queue.SimpleQueue()
    registry.task("wait")((_def_waits if kind == "def" else _async_waits)(seen))
    r = await pgworker.enqueue(conn, "wait", {})
    async with serving_guarded(registry, dsn):
        assert await _got(seen) == "running"
        await wait_for(lambda: has_status(conn, r.job.id, "running"))
        assert await pgworker.cancel(conn, r.job.id) == "cancelling"
        got = {await _got(seen)} | ({await _got(seen)} if kind == "async" else set())
        await wait_for(lambda: has_status(conn, r.job.id, "cancelled"))
    if kind == "def":
        assert got == {("set", True)}
    else:
        assert got == {("thread", True), ("cancelled", True)}


@pytest.mark.parametrize("kind", ["def", "async"])
async def test_stopping_is_set_at_the_tasks_timeout(dsn, conn, kind):
    registry = pgworker.Registry()
    seen: queue.SimpleQueue[Any] = queue.SimpleQueue()
    handler = (_def_waits if kind == "def" else _async_waits)(seen)
    registry.task("wait", timeout=0.5, max_retries=0)(handler)
    r = await pgworker.enqueue(conn, "wait", {})
    async with serving_guarded(registry, dsn):
        assert await _got(seen) == "running"
        got = {await _got(seen)} | ({await _got(seen)} if kind == "async" else set())
        await wait_for(lambda: has_status(conn, r.job.id, "failed"))
    assert await status_of(conn, r.job.id) == "failed"
    if kind == "def":
        assert got == {("set", True)}
    else:
        assert got == {("thread", True), ("cancelled", True)}


async def test_a_call_waiting_when_the_attempt_is_stopped_raises_in_the_thread(dsn, conn):
    """A def handler blocked in ctx.step when an operator cancels its job gets CancelledError
    there, as an awaiting async handler would; the step is not recorded."""
    registry = pgworker.Registry()
    seen: queue.SimpleQueue[Any] = queue.SimpleQueue()

    async def slow() -> None:
        seen.put("running")
        await anyio.sleep(60)

    @registry.task("blocked")
    def blocked(ctx: pgworker.JobContext, payload: Any) -> None:
        try:
            ctx.step("slow", slow)
        except BaseException as exc:
            seen.put(type(exc).__name__)
            raise
        seen.put("returned")

    r = await pgworker.enqueue(conn, "blocked", {})
    async with serving_guarded(registry, dsn):
        assert await _got(seen) == "running"
        await wait_for(lambda: has_status(conn, r.job.id, "running"))
        await pgworker.cancel(conn, r.job.id)
        assert await _got(seen) == "CancelledError"
        await wait_for(lambda: has_status(conn, r.job.id, "cancelled"))
    assert await step_rows(conn, r.job.id) == []


async def test_run_job_runs_a_def_handlers_steps_and_milestones():
    """`pgworker.testing.run_job` (no database) gives a def handler the same blocking calls."""
    from pgworker.testing import run_job

    registry = pgworker.Registry()

    @registry.task("x")
    def x(ctx: pgworker.JobContext, payload: Any) -> int:
        value = ctx.step("a", lambda: 5)
        ctx.progress("m", {"v": value})
        return int(value) + (100 if ctx.stopping.is_set() else 1)

    run = await run_job(registry, "x", {})
    assert (run.status, run.result, run.steps, run.progress["detail"]) == (
        "completed",
        6,
        {"a": 5},
        {"v": 5},
    )


async def test_stopping_is_set_when_the_attempt_loses_its_lease(dsn, conn):
    """The job is claimed again behind the worker's back: its next heartbeat finds the lease
    not held and stops the attempt as lost, which sets ctx.stopping."""
    registry = pgworker.Registry()
    seen: queue.SimpleQueue[Any] = queue.SimpleQueue()
    registry.task("wait")(_def_waits(seen))
    r = await pgworker.enqueue(conn, "wait", {})
    async with serving_guarded(registry, dsn, lease=1.5):
        assert await _got(seen) == "running"
        await conn.execute(
            "UPDATE pgworker.jobs SET attempts = attempts + 1, claimed_at = clock_timestamp() "
            "WHERE id = $1",
            r.job.id,
        )
        assert await _got(seen) == ("set", True)
