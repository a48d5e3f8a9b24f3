"""Durable steps and milestones: what runs once per job, what a later
attempt gets back, the attempt's fence on every write, and the bad input that writes nothing."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import anyio
import asyncpg
import pytest
import pytest_asyncio

import pgworker
from pgworker import ValidationError
from pgworker._attempt import Attempt
from pgworker._db.queries import queries
from pgworker._steps.store import StepStore
from pgworker.context import JobContext

from .helpers import fake_claim, has_status, serving_guarded, spawn_worker, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")
Q = queries("pgworker")
FAST = pgworker.RetryPolicy(max_retries=3, initial_delay=0.05)


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


async def step_rows(conn: Any, job_id: int) -> list[Any]:
    return await conn.fetch(
        "SELECT name, result, attempt FROM pgworker.job_steps WHERE job_id = $1 ORDER BY name",
        job_id,
    )


async def milestone_rows(conn: Any, job_id: int) -> list[Any]:
    return await conn.fetch(
        "SELECT attempt, milestone, detail FROM pgworker.job_milestones WHERE job_id = $1 "
        "ORDER BY seq",
        job_id,
    )


async def progress_of(conn: Any, job_id: int) -> Any:
    text = await conn.fetchval("SELECT progress::text FROM pgworker.jobs WHERE id = $1", job_id)
    return None if text is None else json.loads(text)


class Contexts:
    """JobContexts of attempts claimed by hand (fake_claim), outside a worker: each write of a
    step then happens exactly when the test says, and an attempt is made to lose its job by
    moving the row, as a rescue or another claim would."""

    def __init__(self, dsn: str, conn: Any) -> None:
        self.store = StepStore(dsn, "pgworker", 4, "test-steps")
        self.conn = conn
        self.loads = 0
        done = self.store.q.job_steps_done

        async def counted(*args: Any) -> Any:
            self.loads += 1
            return await done(*args)

        self.store.q = type(self.store.q)(self.store.q.schema)
        self.store.q.job_steps_done = counted  # type: ignore[method-assign]

    async def claim(self, job_id: int) -> JobContext:
        await fake_claim(self.conn, job_id, worker_id="test-steps", lease_s=600)
        row = await Q.job_get(self.conn, job_id)
        return JobContext(Attempt(row, self.store), "test-steps")

    async def new(self, payload: Any = None) -> JobContext:
        r = await pgworker.enqueue(self.conn, "t", payload or {})
        return await self.claim(r.job.id)

    async def lose(self, ctx: JobContext, conn: Any = None) -> None:
        """The attempt's job is claimed again elsewhere: the attempt no longer holds it."""
        await (conn or self.conn).execute(
            "UPDATE pgworker.jobs SET attempts = attempts + 1, claimed_at = clock_timestamp() "
            "WHERE id = $1",
            ctx.job_id,
        )

    async def end(self, ctx: JobContext) -> None:
        """The attempt ends (its outcome, retried): the job is pending for the next one."""
        await self.conn.execute(
            "UPDATE pgworker.jobs SET status = 'pending', lease_expires_at = NULL WHERE id = $1",
            ctx.job_id,
        )


@pytest_asyncio.fixture(loop_scope="session")
async def contexts(dsn: str, conn: Any) -> AsyncIterator[Contexts]:
    c = Contexts(dsn, conn)
    try:
        yield c
    finally:
        await c.store.close()


# --- acceptance -----------------------------------------------------------------------------------


async def test_three_steps_failing_after_the_second_run_each_step_once(dsn, conn):
    """Steps 1 and 2 run on the first attempt, which then fails; the retry gets their results
    back without running them, and runs step 3. The calls are counted in a table."""
    await conn.execute("CREATE TABLE step_calls (name text, attempt int)")
    registry = pgworker.Registry()

    async def call(name: str, attempt: int) -> str:
        c = await asyncpg.connect(dsn)
        try:
            await c.execute("INSERT INTO step_calls VALUES ($1, $2)", name, attempt)
        finally:
            await c.close()
        return f"{name} by attempt {attempt}"

    def sync_call(name: str, attempt: int) -> dict[str, Any]:
        return {"name": name, "thread": threading.current_thread().name, "attempt": attempt}

    @registry.task("three", retry=FAST)
    async def three(ctx: pgworker.JobContext, payload: dict[str, Any]) -> list[Any]:
        one = await ctx.step("one", call, "one", ctx.attempt)
        two = await ctx.step("two", sync_call, "two", attempt=ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("fails after the second step")
        three = await ctx.step("three", call, "three", ctx.attempt)
        return [one, two, three]

    r = await pgworker.enqueue(conn, "three", {})
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, r.job.id, "completed"))
    calls = await conn.fetch("SELECT name, attempt FROM step_calls ORDER BY name")
    assert [(c["name"], c["attempt"]) for c in calls] == [("one", 1), ("three", 2)]
    job = await pgworker.get_job(conn, r.job.id)
    assert job is not None and job.attempts == 2
    assert job.result[0] == "one by attempt 1" and job.result[2] == "three by attempt 2"
    assert job.result[1]["attempt"] == 1 and job.result[1]["thread"] == "pgworker-handler"
    assert [(s["name"], s["attempt"]) for s in await step_rows(conn, r.job.id)] == [
        ("one", 1),
        ("three", 2),
        ("two", 1),
    ]
    assert job.steps == {"one": "one by attempt 1", "two": job.result[1], "three": job.result[2]}


async def test_a_transactional_step_killed_inside_its_transaction_leaves_nothing(
    dsn, conn, tmp_path
):
    """SIGKILL a real worker while its transactional step's effect is written but not committed
    (the handler writes a barrier file, then waits inside the transaction): neither effect nor
    checkpoint survives; the rescue retries the job, whose step runs again: exactly one effect,
    one checkpoint, and the milestone of the killed attempt is what the retry resumes from."""
    await conn.execute("CREATE TABLE step_effects (job_id bigint, attempt int)")
    barrier = tmp_path / "inside-the-transaction"
    r = await pgworker.enqueue(conn, "tx-effect", {"barrier": str(barrier)})
    procs: list[subprocess.Popen[bytes]] = []
    try:
        a = spawn_worker("tests.apps.steps", dsn, tmp_path / "a.log", "--lease", "1")
        procs.append(a)
        await wait_for(barrier.exists, timeout=30)
        # The effect is written, uncommitted: nobody else sees it.
        assert await conn.fetchval("SELECT count(*) FROM step_effects") == 0
        a.send_signal(signal.SIGKILL)
        a.wait()
        assert await conn.fetchval("SELECT count(*) FROM step_effects") == 0
        assert await step_rows(conn, r.job.id) == []
        b = spawn_worker("tests.apps.steps", dsn, tmp_path / "b.log", "--lease", "1")
        procs.append(b)
        await wait_for(lambda: has_status(conn, r.job.id, "completed"), timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    effects = await conn.fetch("SELECT job_id, attempt FROM step_effects")
    assert [(e["job_id"], e["attempt"]) for e in effects] == [(r.job.id, 2)]
    assert [(s["name"], s["attempt"]) for s in await step_rows(conn, r.job.id)] == [("effect", 2)]
    outcomes = await conn.fetch(
        "SELECT outcome FROM pgworker.job_attempts WHERE job_id = $1 ORDER BY attempt", r.job.id
    )
    assert [o["outcome"] for o in outcomes] == ["lost", "completed"]
    job = await pgworker.get_job(conn, r.job.id)
    assert job is not None
    assert job.result["effect_by_attempt"] == 2
    resumed_from = job.result["last_progress"]
    assert (resumed_from["milestone"], resumed_from["attempt"]) == ("started", 1)
    # The progress survived the rescue, then the completion.
    assert (job.progress["milestone"], job.progress["attempt"]) == ("started", 2)


# --- steps ----------------------------------------------------------------------------------------


async def test_a_step_done_is_returned_without_running_it_again(contexts, conn):
    ctx = await contexts.new()
    calls: list[int] = []

    async def charge(amount: int, *, currency: str) -> dict[str, Any]:
        calls.append(amount)
        return {"charged": amount, "currency": currency}

    assert await ctx.step("charge", charge, 5, currency="EUR") == {"charged": 5, "currency": "EUR"}
    # Used again in the same attempt: the stored result, fn not called.
    assert await ctx.step("charge", charge, 7, currency="USD") == {"charged": 5, "currency": "EUR"}
    await contexts.end(ctx)
    later = await contexts.claim(ctx.job_id)
    assert later.attempt == 2
    assert await later.step("charge", charge, 9, currency="GBP") == {
        "charged": 5,
        "currency": "EUR",
    }
    assert calls == [5]
    [row] = await step_rows(conn, ctx.job_id)
    assert (row["name"], json.loads(row["result"]), row["attempt"]) == (
        "charge",
        {"charged": 5, "currency": "EUR"},
        1,
    )


async def test_a_step_that_raises_stores_nothing_and_runs_again(contexts, conn):
    ctx = await contexts.new()
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("remote down")
        return "ok"

    with pytest.raises(ConnectionError):
        await ctx.step("remote", flaky)
    assert await step_rows(conn, ctx.job_id) == []
    assert await ctx.step("remote", flaky) == "ok"
    assert len(calls) == 2 and len(await step_rows(conn, ctx.job_id)) == 1


async def test_steps_done_are_read_once_per_attempt_and_never_without_a_step(contexts):
    ctx = await contexts.new()

    async def value(v: int) -> int:
        return v

    for n in range(3):
        assert await ctx.step(f"s{n}", value, n) == n
    assert contexts.loads == 1
    await contexts.end(ctx)
    later = await contexts.claim(ctx.job_id)
    assert [await later.step(f"s{n}", value, 99) for n in range(3)] == [0, 1, 2]
    assert contexts.loads == 2
    untouched = await contexts.new()
    assert untouched.last_progress is None and untouched.key("k")
    assert contexts.loads == 2


async def test_a_worker_whose_handlers_use_no_step_opens_no_steps_connection(dsn, conn):
    registry = pgworker.Registry()
    seen: list[Any] = []

    @registry.task("plain")
    async def plain(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        seen.append(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name LIKE 'pgworker:%:steps'"
            )
        )

    async with serving_guarded(registry, dsn):
        for _ in range(3):
            await pgworker.enqueue(conn, "plain", {})
        await wait_for(lambda: len(seen) == 3)
    assert seen == [0, 0, 0]


async def test_results_come_back_as_stored_the_first_time_too(contexts):
    ctx = await contexts.new()

    def pair() -> tuple[int, int]:
        return (1, 2)

    assert await ctx.step("pair", pair) == [1, 2]
    assert await ctx.step("none", lambda: None) is None


async def test_a_sync_step_runs_in_a_thread(contexts):
    ctx = await contexts.new()
    loop_thread = threading.get_ident()
    assert await ctx.step("where", threading.get_ident) != loop_thread


async def test_the_key_is_stable_across_attempts(contexts):
    ctx = await contexts.new()
    key = ctx.key("charge")
    assert key == f"pgworker:{ctx.job_id}:charge"
    await contexts.end(ctx)
    assert (await contexts.claim(ctx.job_id)).key("charge") == key
    with pytest.raises(ValidationError) as e:
        ctx.key("")
    assert e.value.field == "name"


async def test_concurrent_first_steps_read_the_steps_done_once(contexts):
    ctx = await contexts.new()

    async def value(v: int) -> int:
        return v

    assert await asyncio.gather(*(ctx.step(f"c{n}", value, n) for n in range(5))) == list(range(5))
    assert contexts.loads == 1


# --- transactional steps --------------------------------------------------------------------------


async def test_a_transactional_step_commits_its_effect_with_its_checkpoint(contexts, conn):
    """The effect (`invoices` has no key: only the step makes it happen once) and the
    checkpoint of attempt 1; attempt 2 gets the result without calling the function."""
    await conn.execute("CREATE TABLE invoices (order_id int)")
    ctx = await contexts.new()
    calls: list[int] = []

    async def invoice(c: Any, order_id: int) -> int:
        calls.append(order_id)
        await c.execute("INSERT INTO invoices VALUES ($1)", order_id)
        return order_id

    assert await ctx.transactional_step("invoice", invoice, 42) == 42
    await contexts.end(ctx)
    later = await contexts.claim(ctx.job_id)
    assert await later.transactional_step("invoice", invoice, 43) == 42
    assert calls == [42]
    assert [r["order_id"] for r in await conn.fetch("SELECT order_id FROM invoices")] == [42]
    [row] = await step_rows(conn, ctx.job_id)
    assert (row["name"], json.loads(row["result"]), row["attempt"]) == ("invoice", 42, 1)


async def test_a_transactional_step_that_raises_rolls_its_effect_back(contexts, conn):
    await conn.execute("CREATE TABLE invoices (order_id int)")
    ctx = await contexts.new()

    async def broken(c: Any) -> None:
        await c.execute("INSERT INTO invoices VALUES (1)")
        raise ValueError("after the write")

    async def unstorable(c: Any) -> set[int]:
        await c.execute("INSERT INTO invoices VALUES (2)")
        return {1}

    with pytest.raises(ValueError, match="after the write"):
        await ctx.transactional_step("invoice", broken)
    with pytest.raises(ValidationError, match="step 'invoice'") as e:
        await ctx.transactional_step("invoice", unstorable)
    assert e.value.field == "result"
    assert await conn.fetchval("SELECT count(*) FROM invoices") == 0
    assert await step_rows(conn, ctx.job_id) == []


async def test_a_transactional_step_needs_an_async_function(contexts, conn):
    ctx = await contexts.new()
    with pytest.raises(ValidationError) as e:
        await ctx.transactional_step("sync", lambda c: 1)
    assert e.value.field == "fn"
    assert await step_rows(conn, ctx.job_id) == []


# --- the attempt's fence --------------------------------------------------------------------------


async def test_an_attempt_that_lost_its_job_runs_no_step(contexts, conn):
    ctx = await contexts.new()
    await contexts.lose(ctx)
    calls: list[int] = []

    async def effect() -> int:
        calls.append(1)
        return 1

    with pytest.raises(pgworker.PgWorkerError, match="no longer holds the job"):
        await ctx.step("effect", effect)
    assert calls == [] and await step_rows(conn, ctx.job_id) == []


async def test_a_step_whose_attempt_lost_the_job_meanwhile_is_not_recorded(contexts, conn):
    ctx = await contexts.new()
    await ctx.step("first", lambda: 1)  # the steps done are read: the attempt held its job

    async def rescued_meanwhile() -> int:
        await contexts.lose(ctx)
        return 2

    with pytest.raises(pgworker.PgWorkerError, match="ran but was not recorded"):
        await ctx.step("second", rescued_meanwhile)
    assert [s["name"] for s in await step_rows(conn, ctx.job_id)] == ["first"]


async def test_a_transactional_step_whose_attempt_lost_the_job_rolls_back(contexts, conn, pool):
    await conn.execute("CREATE TABLE invoices (order_id int)")
    ctx = await contexts.new()
    await ctx.step("first", lambda: 1)

    async def invoice(c: Any) -> int:
        await c.execute("INSERT INTO invoices VALUES (1)")
        async with pool.acquire() as other:
            await contexts.lose(ctx, other)
        return 1

    with pytest.raises(pgworker.PgWorkerError, match="rolled back"):
        await ctx.transactional_step("invoice", invoice)
    assert await conn.fetchval("SELECT count(*) FROM invoices") == 0
    assert [s["name"] for s in await step_rows(conn, ctx.job_id)] == ["first"]


async def test_a_lost_attempt_records_no_milestone(contexts, conn):
    ctx = await contexts.new()
    await ctx.progress("kept")
    await contexts.lose(ctx)
    with pytest.raises(pgworker.PgWorkerError, match="milestone 'late' not recorded"):
        await ctx.progress("late", {"n": 1})
    assert (await progress_of(conn, ctx.job_id))["milestone"] == "kept"
    assert [m["milestone"] for m in await milestone_rows(conn, ctx.job_id)] == ["kept"]


# --- milestones -----------------------------------------------------------------------------------


async def test_milestones_are_kept_through_retries_and_after_completion(dsn, conn):
    registry = pgworker.Registry()
    seen: list[Any] = []

    @registry.task("resumable", retry=FAST)
    async def resumable(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        seen.append(ctx.last_progress)
        if ctx.attempt == 1:
            await ctx.progress("fetched", {"rows": 10})
            raise RuntimeError("fails after the milestone")
        await ctx.progress("loaded")

    r = await pgworker.enqueue(conn, "resumable", {})
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, r.job.id, "completed"))
    assert seen[0] is None
    assert (seen[1]["milestone"], seen[1]["detail"], seen[1]["attempt"]) == (
        "fetched",
        {"rows": 10},
        1,
    )
    assert datetime.fromisoformat(seen[1]["at"]).utcoffset() is not None
    progress = await progress_of(conn, r.job.id)
    assert set(progress) == {"milestone", "detail", "at", "attempt"}
    assert (progress["milestone"], progress["detail"], progress["attempt"]) == ("loaded", None, 2)
    history = await pgworker.operations.job_milestones(conn, r.job.id)
    assert [(m["milestone"], m["detail"], m["attempt"]) for m in history] == [
        ("fetched", {"rows": 10}, 1),
        ("loaded", None, 2),
    ]
    assert history[0]["seq"] < history[1]["seq"] and isinstance(history[1]["at"], datetime)


async def test_job_steps_are_listed_with_the_job(contexts, conn):
    ctx = await contexts.new()
    await ctx.step("b", lambda: {"x": 1})
    await ctx.step("a", lambda: [1])
    steps = await pgworker.operations.job_steps(conn, ctx.job_id)
    assert [(s["name"], s["result"], s["attempt"]) for s in steps] == [
        ("b", {"x": 1}, 1),
        ("a", [1], 1),
    ]
    assert all(s["started_at"] <= s["finished_at"] for s in steps)
    job = await pgworker.get_job(conn, ctx.job_id)
    assert job is not None and job.steps == {"b": {"x": 1}, "a": [1]}
    assert await pgworker.operations.job_steps(conn, 10**12) == []


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", None, 5, "x" * 201, "nul\x00"])
async def test_a_bad_step_name_is_refused_naming_it(contexts, conn, name):
    ctx = await contexts.new()
    calls: list[int] = []
    for run in (ctx.step, ctx.transactional_step):
        with pytest.raises(ValidationError) as e:
            await run(name, lambda *a: calls.append(1))
        assert e.value.field == "name"
    assert calls == [] and await step_rows(conn, ctx.job_id) == []
    assert contexts.loads == 0


@pytest.mark.parametrize(
    "result",
    [{1, 2}, float("nan"), object(), "nul\x00", "\ud800", nested(600)],
    ids=["set", "nan", "object", "nul", "surrogate", "too-deep"],
)
async def test_a_result_that_cannot_be_stored_fails_the_step_naming_it(contexts, conn, result):
    ctx = await contexts.new()
    with pytest.raises(ValidationError, match="step 'bad'") as e:
        await ctx.step("bad", lambda: result)
    assert e.value.field == "result" and "nothing was stored" in str(e.value)
    assert await step_rows(conn, ctx.job_id) == []


@pytest.mark.parametrize(
    ("milestone", "detail", "field"),
    [
        ("", None, "milestone"),
        (3, None, "milestone"),
        ("ok", [1], "detail"),
        ("ok", {"s": {1}}, "detail"),
    ],
)
async def test_a_bad_milestone_is_refused_naming_it(contexts, conn, milestone, detail, field):
    ctx = await contexts.new()
    with pytest.raises(ValidationError) as e:
        await ctx.progress(milestone, detail)
    assert e.value.field == field
    assert await progress_of(conn, ctx.job_id) is None
    assert await milestone_rows(conn, ctx.job_id) == []


async def test_a_step_that_is_not_callable_is_refused(contexts):
    ctx = await contexts.new()
    with pytest.raises(ValidationError) as e:
        await ctx.step("x", 42)  # type: ignore[arg-type]
    assert e.value.field == "fn"


# --- steps run twice at once, transactions ended inside a step, steps from def handlers ------


class PooledContexts:
    """JobContexts of attempts claimed by hand (fake_claim), outside a worker, their steps on a
    store of `size` connections (a worker's has one per slot)."""

    def __init__(self, dsn: str, conn: Any) -> None:
        self.dsn = dsn
        self.conn = conn
        self.stores: list[StepStore] = []

    async def new(self, payload: Any = None, size: int = 4) -> JobContext:
        store = StepStore(self.dsn, "pgworker", size, "hostile4")
        self.stores.append(store)
        r = await pgworker.enqueue(self.conn, "t", payload or {})
        await fake_claim(self.conn, r.job.id, worker_id="hostile4", lease_s=600)
        row = await Q.job_get(self.conn, r.job.id)
        return JobContext(Attempt(row, store), "hostile4")

    async def close(self) -> None:
        for store in self.stores:
            await store.close()


@pytest_asyncio.fixture(loop_scope="session")
async def contexts_pooled(dsn: str, conn: Any) -> AsyncIterator[PooledContexts]:
    c = PooledContexts(dsn, conn)
    try:
        yield c
    finally:
        await c.close()


async def step_names(conn: Any, job_id: int) -> list[str]:
    rows = await conn.fetch(
        "SELECT name FROM pgworker.job_steps WHERE job_id = $1 ORDER BY name", job_id
    )
    return [r["name"] for r in rows]


async def test_one_step_run_by_two_tasks_of_a_handler_at_once_runs_once(contexts_pooled):
    """`asyncio.gather(ctx.step("x", f), ctx.step("x", f))`: both saw the step not done and both
    ran `f` (the record kept the first result). One runs it; the other gets its result."""
    ctx = await contexts_pooled.new()
    calls: list[int] = []

    async def charge() -> int:
        calls.append(1)
        await asyncio.sleep(0.05)
        return len(calls)

    with anyio.fail_after(10):
        first, second = await asyncio.gather(ctx.step("x", charge), ctx.step("x", charge))
    assert calls == [1]
    assert first == second == 1


async def test_one_transactional_step_run_by_two_tasks_at_once_writes_once(contexts_pooled, conn):
    await conn.execute("CREATE TABLE effects (job_id bigint)")
    ctx = await contexts_pooled.new()

    async def write(c: Any) -> str:
        await c.execute("INSERT INTO effects VALUES ($1)", ctx.job_id)
        await asyncio.sleep(0.05)
        return "written"

    with anyio.fail_after(10):
        results = await asyncio.gather(
            ctx.transactional_step("w", write), ctx.transactional_step("w", write)
        )
    assert results == ["written", "written"]
    assert await conn.fetchval("SELECT count(*) FROM effects") == 1


@pytest.mark.parametrize("ending", ["ROLLBACK", "COMMIT"])
async def test_a_transactional_step_that_ends_its_transaction_is_not_recorded(
    contexts_pooled, conn, ending
):
    """fn sends ROLLBACK (or COMMIT) itself: the record then committed alone, a checkpoint
    without its effect (ROLLBACK: the effect never happens, the step is done). Now a
    ValidationError naming fn, and no step recorded."""
    await conn.execute("CREATE TABLE effects (x int)")
    ctx = await contexts_pooled.new()

    async def sneaky(c: Any) -> str:
        await c.execute("INSERT INTO effects VALUES (1)")
        await c.execute(ending)
        return "done"

    with anyio.fail_after(10), pytest.raises(pgworker.ValidationError) as caught:
        await ctx.transactional_step("sneaky", sneaky)
    assert caught.value.field == "fn" and "'sneaky'" in str(caught.value)
    assert await step_names(conn, ctx.job_id) == []


async def test_a_savepoint_inside_a_transactional_step_is_fine(contexts_pooled, conn):
    await conn.execute("CREATE TABLE effects (x int)")
    ctx = await contexts_pooled.new()

    async def with_savepoint(c: Any) -> int:
        await c.execute("INSERT INTO effects VALUES (1)")
        try:
            async with c.transaction():
                await c.execute("INSERT INTO effects VALUES (2)")
                raise RuntimeError("undo the savepoint")
        except RuntimeError:
            pass
        return 1

    with anyio.fail_after(10):
        assert await ctx.transactional_step("sp", with_savepoint) == 1
    assert [r["x"] for r in await conn.fetch("SELECT x FROM effects")] == [1]
    assert await step_names(conn, ctx.job_id) == ["sp"]


@pytest.mark.parametrize("inner", ["progress", "step", "transactional_step"])
async def test_a_milestone_or_step_inside_a_transactional_step_is_a_clear_error(
    contexts_pooled, conn, inner
):
    """With every connection of the steps' pool (one per slot) inside a transactional step,
    `ctx.progress` or `ctx.step` in its function waited for another connection forever: the job
    stuck, its lease renewed. Now a PgWorkerError at once, naming the outer step; nothing
    recorded."""
    ctx = await contexts_pooled.new(size=1)

    async def nothing(*_: Any) -> int:
        return 1

    async def outer(c: Any) -> int:
        if inner == "progress":
            await ctx.progress("inside")
        elif inner == "step":
            await ctx.step("inner", nothing)
        else:
            await ctx.transactional_step("inner", nothing)
        return 1

    with anyio.fail_after(10), pytest.raises(pgworker.PgWorkerError, match="'outer'"):
        await ctx.transactional_step("outer", outer)
    assert await step_names(conn, ctx.job_id) == []
    assert await conn.fetchval("SELECT count(*) FROM pgworker.job_milestones") == 0


async def test_a_step_from_a_plain_def_handler_runs_and_returns_its_result(dsn, conn):
    """In a `def` handler (a thread), `ctx.step(...)` once made a coroutine that nobody awaited:
    `fn` never ran, the job completed as if it had (then it raised PgWorkerError at once). Now
    the call runs the step on the worker's loop and returns its result."""
    registry = pgworker.Registry()
    ran: list[str] = []

    @registry.task("sync-steps", max_retries=0)
    def handler(ctx: pgworker.JobContext, payload: Any) -> Any:
        return ctx.step("charge", lambda: ran.append("charged") or "charged")

    r = await pgworker.enqueue(conn, "sync-steps", {})
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, r.job.id, "completed"))
    job = await pgworker.get_job(conn, r.job.id)
    assert job is not None and job.result == "charged"
    assert ran == ["charged"]
