"""Hostile users, fourth round: issue 13's features (durable steps, milestones, redaction,
retry budgets, failed jobs and replay, retention, payload versions) attacked by handlers and by
operators' command lines. Each test states what must hold, and failed before its fix."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import pytest_asyncio

import pgworker
from pgworker._attempt import Attempt
from pgworker._db.queries import queries
from pgworker._steps.store import StepStore
from pgworker.context import JobContext

from .helpers import cli, fake_claim, has_status, serving_guarded, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")
Q = queries("pgworker")
FAST = pgworker.RetryPolicy(max_retries=3, initial_delay=0.05, max_delay=0.05)


class Contexts:
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
async def contexts(dsn: str, conn: Any) -> AsyncIterator[Contexts]:
    c = Contexts(dsn, conn)
    try:
        yield c
    finally:
        await c.close()


async def step_names(conn: Any, job_id: int) -> list[str]:
    rows = await conn.fetch(
        "SELECT name FROM pgworker.job_steps WHERE job_id = $1 ORDER BY name", job_id
    )
    return [r["name"] for r in rows]


# --- steps ----------------------------------------------------------------------------------------


async def test_one_step_run_by_two_tasks_of_a_handler_at_once_runs_once(contexts):
    """`asyncio.gather(ctx.step("x", f), ctx.step("x", f))`: both saw the step not done and both
    ran `f` (the record kept the first result). One runs it; the other gets its result."""
    ctx = await contexts.new()
    calls: list[int] = []

    async def charge() -> int:
        calls.append(1)
        await asyncio.sleep(0.05)
        return len(calls)

    with anyio.fail_after(10):
        first, second = await asyncio.gather(ctx.step("x", charge), ctx.step("x", charge))
    assert calls == [1]
    assert first == second == 1


async def test_one_transactional_step_run_by_two_tasks_at_once_writes_once(contexts, conn):
    await conn.execute("CREATE TABLE effects (job_id bigint)")
    ctx = await contexts.new()

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
    contexts, conn, ending
):
    """fn sends ROLLBACK (or COMMIT) itself: the record then committed alone, a checkpoint
    without its effect (ROLLBACK: the effect never happens, the step is done). Now a
    ValidationError naming fn, and no step recorded."""
    await conn.execute("CREATE TABLE effects (x int)")
    ctx = await contexts.new()

    async def sneaky(c: Any) -> str:
        await c.execute("INSERT INTO effects VALUES (1)")
        await c.execute(ending)
        return "done"

    with anyio.fail_after(10), pytest.raises(pgworker.ValidationError) as caught:
        await ctx.transactional_step("sneaky", sneaky)
    assert caught.value.field == "fn" and "'sneaky'" in str(caught.value)
    assert await step_names(conn, ctx.job_id) == []


async def test_a_savepoint_inside_a_transactional_step_is_fine(contexts, conn):
    await conn.execute("CREATE TABLE effects (x int)")
    ctx = await contexts.new()

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
    contexts, conn, inner
):
    """With every connection of the steps' pool (one per slot) inside a transactional step,
    `ctx.progress` or `ctx.step` in its function waited for another connection forever: the job
    stuck, its lease renewed. Now a PgWorkerError at once, naming the outer step; nothing
    recorded."""
    ctx = await contexts.new(size=1)

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
    the call runs the step on the worker's loop and returns its result (issue 24)."""
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


# --- secrets --------------------------------------------------------------------------------------


async def texts_of(conn: Any, job_id: int) -> str:
    """Every text pgworker stored about a job: its row and its attempts' rows."""
    row = await conn.fetchval(
        "SELECT to_jsonb(j)::text FROM pgworker.jobs AS j WHERE id = $1", job_id
    )
    attempts = await conn.fetchval(
        "SELECT coalesce(jsonb_agg(to_jsonb(a)), '[]')::text FROM pgworker.job_attempts AS a "
        "WHERE job_id = $1",
        job_id,
    )
    # The payload holds the secrets as given: what matters is every other column.
    job = json.loads(row)
    del job["payload"]
    return json.dumps(job) + attempts


async def test_a_secret_in_another_letter_case_or_url_encoded_is_redacted(dsn, conn):
    """The payload's password shown upper-cased, and its api key URL-encoded (as an HTTP
    client's error quotes a query string), were stored word for word in jobs.error and
    job_attempts."""
    registry = pgworker.Registry()

    @registry.task("login", max_retries=0)
    async def login(ctx: pgworker.JobContext, p: dict[str, Any]) -> None:
        from urllib.parse import quote

        raise ValueError(
            f"user {p['password'].upper()} refused; GET /x?k={quote(p['api_key'], safe='')}\n"
            f"second line {p['password'].upper()}"
        )

    payload = {"password": "Hunter2-Xyzzy", "api_key": "sk live/123 ü"}
    r = await pgworker.enqueue(conn, "login", payload)
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, r.job.id, "failed"))
    stored = await texts_of(conn, r.job.id)
    assert "[REDACTED]" in stored
    for leak in ("HUNTER2-XYZZY", "sk%20live%2F123%20%C3%BC", "Hunter2"):
        assert leak.lower() not in stored.lower(), leak


async def test_a_payload_with_many_secrets_never_stalls_the_worker(dsn, conn):
    """20,000 tokens under a sensitive key: each failure searched its texts with a regular
    expression of 20,000+ alternatives, tried at every position, for seconds on the event loop
    (no heartbeat, no claim meanwhile) per text. Now the search is bounded and such a payload's
    error texts are withheld whole: no token is stored, the job fails promptly."""
    import random
    import string
    import time

    from pgworker._redact import redactor

    rng = random.Random(13)
    tokens = ["".join(rng.choices(string.ascii_letters, k=12)) for _ in range(20_000)]
    started = time.thread_time()  # CPU time: a loaded machine does not stretch it
    text = redactor().text("x" * 60_000 + tokens[7], {"tokens": tokens})
    assert time.thread_time() - started < 2.0
    assert tokens[7] not in text

    registry = pgworker.Registry()

    @registry.task("many", max_retries=0)
    async def many(ctx: pgworker.JobContext, p: dict[str, Any]) -> None:
        raise ValueError(f"rejected {p['tokens'][7]} and {p['tokens'][19_999]}")

    r = await pgworker.enqueue(conn, "many", {"tokens": tokens})
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, r.job.id, "failed"), timeout=20)
    stored = await texts_of(conn, r.job.id)
    assert tokens[7] not in stored and tokens[19_999] not in stored
    assert "REDACTED" in stored


# --- the command line -----------------------------------------------------------------------------


def nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth - 1):
        value = {"password": "p4ssw0rd-deep", "next": value}
    return value


@pytest.mark.parametrize("form", ["text", "json"])
async def test_show_a_job_whose_payload_is_nested_as_deep_as_enqueue_allows(dsn, conn, form):
    """A payload nested 499 deep (enqueue takes 500) and a step result as deep: `pgworker show`
    died with a RecursionError traceback (redacting the payload, making it JSON)."""
    r = await pgworker.enqueue(conn, "deep", nested(499, 1))
    await conn.execute(
        "INSERT INTO pgworker.job_steps (job_id, name, result, attempt, started_at) "
        "VALUES ($1, 's', $2::jsonb, 1, now())",
        r.job.id,
        json.dumps(nested(400, [1])),
    )
    shown = cli("show", str(r.job.id), *(["--json"] if form == "json" else []), "--dsn", dsn)
    assert shown.returncode == 0, shown.stderr
    assert "p4ssw0rd-deep" not in shown.stdout.split("steps")[0]
    if form == "json":
        payload = json.loads(shown.stdout)["job"]["payload"]
        assert payload["password"] == "[REDACTED]"


@pytest.mark.parametrize("payload", [[1, {"token": "tok-12345"}], "a string", 42, None, True])
async def test_show_a_job_whose_payload_is_not_an_object(dsn, conn, payload):
    r = await pgworker.enqueue(conn, "scalar", payload)
    for extra in ([], ["--json"]):
        shown = cli("show", str(r.job.id), *extra, "--dsn", dsn)
        assert shown.returncode == 0, shown.stderr
        assert "tok-12345" not in shown.stdout


# --- retry policy, versions -----------------------------------------------------------------------


async def test_max_retries_beside_a_policy_keeps_its_retry_budget():
    """`task(max_retries=3, retry=RetryPolicy(max_retries=3, max_elapsed=60))` rebuilt the
    policy from four of its fields: the retry budget in time was dropped, silently."""
    registry = pgworker.Registry()
    policy = pgworker.RetryPolicy(max_retries=3, initial_delay=2, max_elapsed=60)

    @registry.task("budgeted", max_retries=3, retry=policy)
    async def handler(ctx: pgworker.JobContext, payload: Any) -> None:
        return None

    assert registry["budgeted"].retry == policy


# --- the Python API of failed jobs ---------------------------------------------------------------


@pytest.mark.parametrize("statuses", [[["failed"]], [{"failed": 1}]])
async def test_prune_with_statuses_that_are_not_names_is_a_validation_error(conn, statuses):
    """A list inside the list raised TypeError (unhashable) from a public function."""
    with pytest.raises(pgworker.ValidationError) as caught:
        await pgworker.prune(conn, older_than=3600, statuses=statuses)
    assert caught.value.field == "statuses"


@pytest.mark.parametrize("keys", ["password", [5], [""], None])
async def test_show_job_with_bad_redact_keys_is_a_validation_error(conn, keys):
    """`redact_keys="password"` redacted every key holding one of its letters; `[5]` raised
    AttributeError once a job was found. Checked like Settings.redact_keys, job or not."""
    from pgworker.operations import show_job

    r = await pgworker.enqueue(conn, "t", {"apple": 1, "password": "hunter2-x"})
    with pytest.raises(pgworker.ValidationError) as caught:
        await show_job(conn, r.job.id, redact_keys=keys)
    assert caught.value.field == "redact_keys"
