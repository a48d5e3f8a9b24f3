"""pgworker.testing, the helpers for users' own test suites: the plugin (in pytest subprocesses,
as users run it), the assertions on what was enqueued, drain through the worker's own claim and
outcome code, run_job without a database, and advance. The example suite of examples/testing
runs here too."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import pgworker
from pgworker.testing import (
    DrainError,
    advance,
    assert_enqueued,
    assert_not_enqueued,
    drain,
    enqueued_jobs,
    run_job,
)

from .helpers import attempts, database_of, status_of

aio = pytest.mark.asyncio(loop_scope="session")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "testing"


def run_pytest(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """pytest in a process of its own, from `cwd`, without the variables of this session."""
    environment = {
        k: v for k, v in os.environ.items() if k not in ("PGWORKER_TEST_DSN", "PYTEST_ADDOPTS")
    }
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


# --- the example suite and the plugin ------------------------------------------------------


def test_the_example_suite_passes(server_dsn):
    done = run_pytest(EXAMPLE, env={"PGWORKER_TEST_DSN": server_dsn})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 passed" in done.stdout, done.stdout


PROJECT = {
    "pytest.ini": """
        [pytest]
        asyncio_mode = strict
        asyncio_default_fixture_loop_scope = function
        asyncio_default_test_loop_scope = function
    """,
    "conftest.py": """
        pytest_plugins = ["pgworker.testing"]
    """,
    "test_plugin.py": """
        import os
        import pytest
        import pgworker
        from pgworker.testing import enqueued_jobs

        pytestmark = pytest.mark.asyncio
        held = []

        async def test_one(pgworker_conn, pgworker_database):
            with open(os.environ["SEEN"], "w") as f:
                f.write(pgworker_database)
            first = await pgworker.enqueue(pgworker_conn, "t", {"n": 1})
            second = await pgworker.enqueue(pgworker_conn, "t", {"n": 2}, idempotency_key="k")
            assert (first.job.id, second.job.id) == (1, 2)
            held.append(pgworker_conn)

        async def test_two_starts_empty(pgworker_conn):
            assert held[0].is_closed()
            assert await enqueued_jobs(pgworker_conn) == []
            again = await pgworker.enqueue(pgworker_conn, "t", {"n": 2}, idempotency_key="k")
            assert again.created and again.job.id == 1

        def test_a_sync_test_gets_the_dsn(pgworker_dsn, pgworker_database):
            assert pgworker_dsn == pgworker_database
    """,
}


def write_project(path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (path / name).write_text(textwrap.dedent(text).lstrip())
    return path


@aio
async def test_the_plugin_makes_a_migrated_scratch_database_emptied_between_tests(
    tmp_path, server_dsn
):
    project = write_project(tmp_path, PROJECT)
    seen = tmp_path / "seen"
    # The option wins over the variable (here a server that does not exist).
    done = run_pytest(
        project,
        "--pgworker-dsn",
        server_dsn,
        env={"SEEN": str(seen), "PGWORKER_TEST_DSN": "postgresql://nobody@127.0.0.1:1/none"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
    database = database_of(seen.read_text())
    assert database.startswith("pgworker_test_")
    admin = await asyncpg.connect(server_dsn)
    try:
        left = await admin.fetchval("SELECT count(*) FROM pg_database WHERE datname = $1", database)
    finally:
        await admin.close()
    assert left == 0, "the scratch database was not dropped"
    # The variable alone.
    done = run_pytest(project, env={"SEEN": str(seen), "PGWORKER_TEST_DSN": server_dsn})
    assert done.returncode == 0, done.stdout + done.stderr
    assert seen.read_text() != database


def test_without_a_server_the_fixtures_say_what_to_set(tmp_path):
    project = write_project(tmp_path, PROJECT)
    done = run_pytest(project, env={"SEEN": str(tmp_path / "seen")})
    assert done.returncode != 0
    assert "--pgworker-dsn" in done.stdout and "PGWORKER_TEST_DSN" in done.stdout
    assert "Traceback" not in done.stdout


def test_the_plugin_is_opt_in(tmp_path, server_dsn):
    project = write_project(tmp_path, {**PROJECT, "conftest.py": ""})
    done = run_pytest(
        project, env={"SEEN": str(tmp_path / "seen"), "PGWORKER_TEST_DSN": server_dsn}
    )
    assert done.returncode != 0 and "fixture 'pgworker_conn' not found" in done.stdout
    done = run_pytest(
        project,
        "-p",
        "pgworker.testing",
        env={"SEEN": str(tmp_path / "seen"), "PGWORKER_TEST_DSN": server_dsn},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    plugins = importlib.metadata.entry_points(group="pytest11")
    assert not [e for e in plugins if e.value.startswith("pgworker")]


def test_the_fixtures_run_under_anyio_without_pytest_asyncio(tmp_path, server_dsn):
    project = write_project(
        tmp_path,
        {
            "pytest.ini": "[pytest]\n",
            "conftest.py": 'pytest_plugins = ["pgworker.testing"]\n',
            "test_anyio.py": """
                import pytest
                import pgworker
                from pgworker.testing import assert_enqueued

                @pytest.fixture
                def anyio_backend():
                    return "asyncio"

                @pytest.mark.anyio
                async def test_one(pgworker_conn):
                    await pgworker.enqueue(pgworker_conn, "t", {"n": 1})
                    await assert_enqueued(pgworker_conn, "t", payload={"n": 1})
            """,
        },
    )
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "pytest_asyncio.py").write_text("raise ImportError('not installed')\n")
    done = run_pytest(
        project,
        "-p",
        "no:asyncio",
        env={"PGWORKER_TEST_DSN": server_dsn, "PYTHONPATH": str(shadow)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_importing_it_needs_only_pytest_and_pgworker():
    program = (
        "import sys\n"
        "sys.modules['pytest_asyncio'] = None\n"  # not installed
        "import pgworker.testing\n"
        "assert pgworker.testing.drain\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    program = "import sys, pgworker\nassert 'pytest' not in sys.modules, 'pytest imported'\n"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# --- enqueued_jobs, assert_enqueued, assert_not_enqueued -----------------------------------


@aio
async def test_enqueued_jobs_filters(conn):
    a = await pgworker.enqueue(conn, "mail", {"to": "a", "n": 1}, queue="q", priority="high")
    b = await pgworker.enqueue(conn, "mail", {"to": "b"}, idempotency_key="kb", correlation_id="c")
    c = await pgworker.enqueue(conn, "sms", {"to": "a"})
    await pgworker.cancel(conn, c.job.id)

    async def ids(*args: Any, **filters: Any) -> list[int]:
        return [j.id for j in await enqueued_jobs(conn, *args, **filters)]

    assert await ids() == [a.job.id, b.job.id, c.job.id]
    assert await ids("mail") == [a.job.id, b.job.id]
    assert await ids(payload={"n": 1, "to": "a"}) == [a.job.id]  # key order does not matter
    assert await ids(payload={"to": "a"}) == [c.job.id]
    assert await ids(payload_contains={"to": "a"}) == [a.job.id, c.job.id]
    assert await ids(queue="q") == [a.job.id]
    assert await ids(priority="high") == [a.job.id]
    assert await ids(status="cancelled") == [c.job.id]
    assert await ids(status=["pending", "cancelled"]) == [a.job.id, b.job.id, c.job.id]
    assert await ids(idempotency_key="kb") == [b.job.id]
    assert await ids(correlation_id="c") == [b.job.id]
    assert await ids("mail", payload_contains={"to": "b"}, status="pending") == [b.job.id]
    [job] = await enqueued_jobs(conn, "sms")
    assert job == await pgworker.get_job(conn, c.job.id)
    with pytest.raises(pgworker.ValidationError) as caught:
        await enqueued_jobs(conn, status="done")
    assert caught.value.field == "status" and "pending" in str(caught.value)


@aio
async def test_assert_enqueued_returns_the_job_or_lists_what_was_enqueued(conn):
    with pytest.raises(AssertionError) as caught:
        await assert_enqueued(conn, "mail")
    assert str(caught.value) == "no job enqueued matching type='mail'; nothing was enqueued"
    a = await pgworker.enqueue(conn, "mail", {"to": "ada"})
    await pgworker.enqueue(conn, "sms", {"to": "bob"}, queue="texts", idempotency_key="k1")
    job = await assert_enqueued(conn, "mail", payload={"to": "ada"})
    assert job.id == a.job.id and job.payload == {"to": "ada"}
    with pytest.raises(AssertionError) as caught:
        await assert_enqueued(conn, "mail", payload={"to": "bob"})
    message = str(caught.value)
    assert message.startswith("no job enqueued matching type='mail', payload={'to': 'bob'}; ")
    assert "enqueued (2):" in message
    assert f'job {a.job.id} \'mail\' {{"to": "ada"}} status=pending' in message
    assert "'sms' {\"to\": \"bob\"} status=pending queue='texts' priority=0 key='k1'" in message
    with pytest.raises(AssertionError) as caught:
        await assert_enqueued(conn, "mail", count=2)
    assert f"expected 2 job(s) matching type='mail', found 1 (ids [{a.job.id}])" in str(
        caught.value
    )
    assert (await assert_enqueued(conn, payload_contains={"to": "bob"}, count=1)).type == "sms"


@aio
async def test_a_failure_message_lists_at_most_twenty_jobs(conn):
    await pgworker.enqueue_many(conn, [pgworker.JobSpec("t", {"n": n}) for n in range(25)])
    with pytest.raises(AssertionError) as caught:
        await assert_enqueued(conn, "other")
    message = str(caught.value)
    assert "enqueued (25):" in message and "… and 5 more" in message
    assert message.count("\n  job ") == 20


@aio
async def test_assert_not_enqueued_lists_the_jobs_that_match(conn):
    await assert_not_enqueued(conn, "mail")
    r = await pgworker.enqueue(conn, "mail", {"to": "ada"})
    await assert_not_enqueued(conn, "mail", status="failed")
    with pytest.raises(AssertionError) as caught:
        await assert_not_enqueued(conn, "mail")
    assert str(caught.value).startswith("expected no job matching type='mail', found 1; ")
    assert f"job {r.job.id} 'mail'" in str(caught.value)


# --- drain ------------------------------------------------------------------------------------


def registry_of(**handlers: Any) -> pgworker.Registry:
    registry = pgworker.Registry()
    for name, fn in handlers.items():
        registry.task(name.replace("_", "-"))(fn)
    return registry


@aio
async def test_drain_runs_due_jobs_through_the_real_claim_and_outcome(conn):
    async def double(ctx, payload):
        return {"twice": payload["n"] * 2}

    r = await pgworker.enqueue(conn, "double", {"n": 21})
    ran = await drain(conn, registry_of(double=double))
    assert ran.outcomes() == ["completed"] and ran.completed == [r.job.id] and len(ran) == 1
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.result, job.max_retries, job.attempts) == (
        "completed",
        {"twice": 42},
        3,  # the task's default, written by the claim
        1,
    )
    [row] = await attempts(conn, r.job.id)
    assert (row["outcome"], row["worker_id"]) == ("completed", "pgworker.testing")
    assert await drain(conn, registry_of(double=double)) == type(ran)()


@aio
async def test_drain_follows_the_claim_order_and_runs_what_handlers_enqueue(dsn, conn):
    order: list[str] = []

    async def step(ctx, payload):
        order.append(payload["name"])
        if payload.get("then"):
            await pgworker.enqueue(conn_for_handlers, "step", {"name": payload["then"]})

    conn_for_handlers = await asyncpg.connect(dsn)
    try:
        await pgworker.enqueue(conn, "step", {"name": "low", "then": "child"}, priority="low")
        await pgworker.enqueue(conn, "step", {"name": "high"}, priority="high")
        ran = await drain(conn, registry_of(step=step))
    finally:
        await conn_for_handlers.close()
    assert order == ["high", "low", "child"] and len(ran.completed) == 3


@aio
async def test_drain_leaves_other_types_and_queues_pending(conn):
    async def ok(ctx, payload):
        return None

    other_type = await pgworker.enqueue(conn, "unknown", {})
    other_queue = await pgworker.enqueue(conn, "ok", {}, queue="elsewhere")
    mine = await pgworker.enqueue(conn, "ok", {})
    ran = await drain(conn, registry_of(ok=ok))
    assert ran.completed == [mine.job.id]
    for r in (other_type, other_queue):
        assert (await pgworker.get_job(conn, r.job.id)).status == "pending"
    ran = await drain(conn, registry_of(ok=ok), queues=["elsewhere"])
    assert ran.completed == [other_queue.job.id]


@aio
async def test_drain_retries_with_the_task_backoff_and_until_lets_it_pass(conn):
    calls: list[int] = []
    registry = pgworker.Registry()

    @registry.task("flaky", retry=pgworker.RetryPolicy(initial_delay=60, jitter=0))
    async def flaky(ctx, payload):
        calls.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ValueError(f"boom {ctx.attempt}")
        return "ok"

    r = await pgworker.enqueue(conn, "flaky", {})
    ran = await drain(conn, registry)
    assert ran.outcomes() == ["retried"] and ran.attempts[0].error == "ValueError: boom 1"
    job = await pgworker.get_job(conn, r.job.id)
    assert job.status == "pending" and job.retry_count == 1
    assert 55 < (job.run_at - datetime.now(UTC)).total_seconds() <= 60
    ran = await drain(conn, registry, until=timedelta(seconds=100))  # 60 s, then 120 s
    assert ran.outcomes() == ["retried"] and calls == [1, 2]
    ran = await drain(conn, registry, until=timedelta(minutes=5))
    assert ran.outcomes() == ["completed"] and calls == [1, 2, 3]
    assert [a["outcome"] for a in await attempts(conn, r.job.id)] == [
        "retried",
        "retried",
        "completed",
    ]
    assert (await pgworker.get_job(conn, r.job.id)).retry_count == 2


@aio
async def test_drain_applies_snooze_retry_and_permanent_error_as_a_worker(conn):
    async def snoozy(ctx, payload):
        if ctx.attempt == 1:
            raise pgworker.Snooze(30)
        return ctx.attempt

    async def retrying(ctx, payload):
        raise pgworker.Retry(after=10)

    async def broken(ctx, payload):
        raise pgworker.PermanentError("no such customer")

    registry = registry_of(snoozy=snoozy, retrying=retrying, broken=broken)
    s = await pgworker.enqueue(conn, "snoozy", {})
    r = await pgworker.enqueue(conn, "retrying", {}, max_retries=2)
    b = await pgworker.enqueue(conn, "broken", {})
    ran = await drain(conn, registry, until=60)
    assert ran.outcomes(s.job.id) == ["snoozed", "completed"]
    assert ran.outcomes(r.job.id) == ["retried", "retried", "failed"]
    assert ran.outcomes(b.job.id) == ["failed"] and ran.failed == [b.job.id, r.job.id]
    assert (await pgworker.get_job(conn, s.job.id)).retry_count == 0
    assert (await pgworker.get_job(conn, b.job.id)).error == "PermanentError: no such customer"
    assert ran.advanced == 60


@aio
async def test_drain_keeps_steps_across_attempts(conn):
    charged: list[int] = []

    async def charge(n: int) -> str:
        charged.append(n)
        return f"charge-{n}"

    async def order(ctx, payload):
        charge_id = await ctx.step("charge", charge, payload["n"])
        await ctx.progress("charged", {"id": charge_id})
        if ctx.attempt == 1:
            raise ConnectionError("mail down")
        return {"charge": charge_id, "resumed_from": ctx.last_progress["milestone"]}

    r = await pgworker.enqueue(conn, "order", {"n": 7})
    ran = await drain(conn, registry_of(order=order), until=timedelta(hours=1))
    assert ran.outcomes() == ["retried", "completed"] and charged == [7]
    job = await pgworker.get_job(conn, r.job.id)
    assert job.result == {"charge": "charge-7", "resumed_from": "charged"}
    assert job.steps == {"charge": "charge-7"}


@aio
async def test_drain_runs_transactional_steps_on_its_connection(conn):
    await conn.execute("CREATE TABLE invoices (order_id int PRIMARY KEY)")

    async def insert(c: asyncpg.Connection, order_id: int) -> int:
        await c.execute("INSERT INTO invoices VALUES ($1)", order_id)
        return order_id

    async def invoice(ctx, payload):
        await ctx.transactional_step("invoice", insert, payload["order"])
        if ctx.attempt == 1:
            raise ConnectionError("later")

    await pgworker.enqueue(conn, "invoice", {"order": 5})
    ran = await drain(conn, registry_of(invoice=invoice), until=timedelta(hours=1))
    assert ran.outcomes() == ["retried", "completed"]
    assert await conn.fetchval("SELECT count(*) FROM invoices") == 1


@aio
async def test_drain_stops_after_max_attempts_naming_the_endless_job(conn):
    async def forever(ctx, payload):
        raise pgworker.Snooze(0)

    async def ok(ctx, payload):
        return None

    registry = registry_of(forever=forever, ok=ok)
    r = await pgworker.enqueue(conn, "forever", {})
    ok_job = await pgworker.enqueue(conn, "ok", {})
    with pytest.raises(DrainError) as caught:
        async with asyncio.timeout(60):  # unbounded, it would never return
            await drain(conn, registry, max_attempts=50)
    message = str(caught.value)
    assert message.startswith("drain ran max_attempts=50 attempts and jobs are still due; ")
    assert f"job {r.job.id} ('forever'): 49 attempts, the last snoozed" in message
    assert f"job {ok_job.job.id} ('ok'): 1 attempt, the last completed" in message
    assert isinstance(caught.value, pgworker.PgWorkerError)
    job = await pgworker.get_job(conn, r.job.id)  # handed back, not left running
    assert (job.status, job.attempts) == ("pending", 50)
    with pytest.raises(pgworker.ValidationError) as invalid:
        await drain(conn, registry, max_attempts=0)
    assert invalid.value.field == "max_attempts"


@aio
async def test_drain_ends_when_a_due_job_is_held_elsewhere(dsn, conn):
    async def ok(ctx, payload):
        return None

    r = await pgworker.enqueue(conn, "ok", {})
    other = await asyncpg.connect(dsn)
    try:
        async with other.transaction():
            await other.execute("SELECT FROM pgworker.jobs WHERE id = $1 FOR UPDATE", r.job.id)
            async with asyncio.timeout(10):
                ran = await drain(conn, registry_of(ok=ok), until=60)
    finally:
        await other.close()
    assert len(ran) == 0


@aio
async def test_drain_takes_a_pool_and_a_moment(pool):
    async def ok(ctx, payload):
        return None

    r = await pgworker.enqueue(pool, "ok", {}, delay=timedelta(hours=2))
    ran = await drain(pool, registry_of(ok=ok), until=datetime.now(UTC) + timedelta(hours=1))
    assert len(ran) == 0 and 3590 < ran.advanced <= 3600
    job = await pgworker.get_job(pool, r.job.id)
    assert 3500 < (job.run_at - datetime.now(UTC)).total_seconds() < 3700
    ran = await drain(pool, registry_of(ok=ok), until=timedelta(hours=1, seconds=5))
    assert ran.completed == [r.job.id]


@aio
async def test_a_drain_cancelled_while_a_handler_runs_hands_its_job_back(conn):
    started = asyncio.Event()

    async def stuck(ctx, payload):
        started.set()
        await asyncio.sleep(30)

    r = await pgworker.enqueue(conn, "stuck", {})
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await drain(conn, registry_of(stuck=stuck))
    assert started.is_set()
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.retry_count) == ("pending", 0)
    assert [a["outcome"] for a in await attempts(conn, r.job.id)] == ["interrupted"]


@aio
async def test_drain_applies_the_task_timeout(conn):
    registry = pgworker.Registry()

    @registry.task("slow", timeout=0.05, max_retries=0)
    async def slow(ctx, payload):
        await asyncio.sleep(30)

    await pgworker.enqueue(conn, "slow", {})
    ran = await drain(conn, registry)
    assert ran.outcomes() == ["timed_out"] and ran.attempts[0].error.startswith("TimeoutError")


# --- advance ----------------------------------------------------------------------------------


@aio
async def test_advance_makes_delayed_jobs_due_in_their_order(conn):
    async def ok(ctx, payload):
        order.append(payload["n"])

    order: list[int] = []
    registry = registry_of(ok=ok)
    await pgworker.enqueue(conn, "ok", {"n": 2}, delay=timedelta(days=2))
    await pgworker.enqueue(conn, "ok", {"n": 1}, delay=timedelta(days=1))
    await pgworker.enqueue(conn, "ok", {"n": 3}, delay=timedelta(days=3))
    assert len(await drain(conn, registry)) == 0
    assert await advance(conn, timedelta(days=1, hours=23)) == 3
    await drain(conn, registry)
    assert order == [1]
    await advance(conn, 86400 * 2)
    await drain(conn, registry)
    assert order == [1, 2, 3]
    budget = await pgworker.enqueue(conn, "ok", {"n": 4}, delay=60)
    started = await conn.fetchval(
        "UPDATE pgworker.jobs SET budget_started_at = now() WHERE id = $1 "
        "RETURNING budget_started_at",
        budget.job.id,
    )
    assert await advance(conn, 30) == 1
    moved = await pgworker.get_job(conn, budget.job.id)
    assert moved.budget_started_at == started - timedelta(seconds=30)
    assert moved.run_at == budget.job.run_at - timedelta(seconds=30)
    with pytest.raises(pgworker.ValidationError) as caught:
        await advance(conn, -1)
    assert caught.value.field == "by"


# --- run_job ----------------------------------------------------------------------------------


def test_run_job_called_from_a_plain_def_test_returns_the_run():
    """`run_job(registry, type, payload)` as the issue writes it: no event loop, no await."""

    async def greet(ctx, payload):
        await ctx.progress("greeted", {"who": payload["who"]})
        return {"hello": payload["who"]}

    run = run_job(registry_of(greet=greet), "greet", {"who": "ada"})
    assert (run.status, run.result) == ("completed", {"hello": "ada"})
    assert run.milestones and run.milestones[-1]["milestone"] == "greeted"


@aio
async def test_run_job_gives_the_handler_a_real_context():
    seen: dict[str, Any] = {}

    async def look(ctx, payload):
        seen.update(
            job_id=ctx.job_id,
            attempt=ctx.attempt,
            payload=ctx.payload,
            type=ctx.type,
            status=ctx.job.status,
            correlation_id=ctx.correlation_id,
            is_context=isinstance(ctx, pgworker.JobContext),
        )
        return (1, "two")

    run = await run_job(registry_of(look=look), "look", {"x": 1}, job_id=9, correlation_id="c")
    assert (run.status, run.outcome, run.result, run.error) == (
        "completed",
        "completed",
        [1, "two"],
        None,
    )
    assert seen == {
        "job_id": 9,
        "attempt": 1,
        "payload": {"x": 1},
        "type": "look",
        "status": "running",
        "correlation_id": "c",
        "is_context": True,
    }


@aio
async def test_run_job_decides_the_outcome_as_a_worker():
    registry = pgworker.Registry()

    @registry.task("fails", retry=pgworker.RetryPolicy(max_retries=2, initial_delay=10, jitter=0))
    async def fails(ctx, payload):
        raise ValueError(f"boom with {payload['password']}")

    @registry.task("snoozes")
    async def snoozes(ctx, payload):
        raise pgworker.Snooze(30)

    @registry.task("permanent")
    def permanent(ctx, payload):  # a plain def handler, in a thread
        raise pgworker.PermanentError("gone")

    run = await run_job(registry, "fails", {"password": "hunter22"})
    assert (run.status, run.outcome, run.delay) == ("pending", "retried", 10.0)
    assert run.error == "ValueError: boom with [REDACTED]"
    assert "hunter22" not in run.traceback and "raise ValueError" in run.traceback
    run = await run_job(registry, "fails", {"password": "x"}, attempt=2)
    assert (run.outcome, run.delay) == ("retried", 20.0)
    run = await run_job(registry, "fails", {"password": "x"}, attempt=3)
    assert (run.status, run.outcome, run.delay) == ("failed", "failed", None)
    run = await run_job(registry, "fails", {"password": "x"}, max_retries=0)
    assert run.status == "failed"
    run = await run_job(registry, "snoozes")
    assert (run.status, run.outcome, run.delay, run.error) == ("pending", "snoozed", 30.0, None)
    run = await run_job(registry, "permanent")
    assert (run.status, run.error) == ("failed", "PermanentError: gone")


@aio
async def test_run_job_records_steps_and_milestones_in_memory():
    sent: list[str] = []

    def send(to: str) -> str:
        sent.append(to)
        return f"msg-{to}"

    async def mail(ctx, payload):
        resumed = ctx.last_progress
        first = await ctx.step("first", send, "a")
        second = await ctx.step("second", send, "b")
        await ctx.progress("sent", {"ids": [first, second]})
        return {"resumed": resumed}

    registry = registry_of(mail=mail)
    run = await run_job(registry, "mail")
    assert run.ran_steps == ["first", "second"] and sent == ["a", "b"]
    assert run.steps == {"first": "msg-a", "second": "msg-b"}
    [milestone] = run.milestones
    assert milestone["milestone"] == "sent" and milestone["detail"] == {"ids": ["msg-a", "msg-b"]}
    assert milestone["attempt"] == 1 and run.progress == milestone
    assert run.result == {"resumed": None}
    sent.clear()
    earlier = {"milestone": "sent", "detail": None, "at": "x", "attempt": 1}
    run = await run_job(
        registry, "mail", attempt=2, steps={"first": "msg-a"}, last_progress=earlier
    )
    assert sent == ["b"] and run.ran_steps == ["second"] and run.result == {"resumed": earlier}


@aio
async def test_run_job_runs_a_transactional_step_only_on_a_connection_given(conn):
    await conn.execute("CREATE TABLE effects (n int)")

    async def write(c: asyncpg.Connection, n: int) -> int:
        await c.execute("INSERT INTO effects VALUES ($1)", n)
        return n

    async def effect(ctx, payload):
        return await ctx.transactional_step("write", write, 3)

    registry = registry_of(effect=effect)
    run = await run_job(registry, "effect", max_retries=0)
    assert run.status == "failed" and "run_job(..., conn=" in run.error
    run = await run_job(registry, "effect", conn=conn)
    assert (run.result, run.steps) == (3, {"write": 3})
    assert await conn.fetchval("SELECT count(*) FROM effects") == 1


@aio
async def test_run_job_applies_the_timeout_and_upgraders():
    registry = pgworker.Registry()

    @registry.task("slow", timeout=0.05)
    async def slow(ctx, payload):
        await asyncio.sleep(30)

    @registry.task("stuck")
    async def stuck(ctx, payload):
        await asyncio.sleep(30)

    @registry.task("v2", version=2, upgrade={1: lambda p: {**p, "v": 2}})
    async def v2(ctx, payload):
        return payload

    run = await run_job(registry, "slow")
    assert run.outcome == "timed_out" and run.error == "TimeoutError: timed out after 0.05s"
    assert (await run_job(registry, "v2", {"a": 1}, version=1)).result == {"a": 1, "v": 2}
    assert (await run_job(registry, "v2", {"a": 1})).result == {"a": 1}
    with pytest.raises(TimeoutError):  # the test's own timeout is not the handler's outcome
        async with asyncio.timeout(0.1):
            await run_job(registry, "stuck")
    with pytest.raises(pgworker.ValidationError) as caught:
        await run_job(registry, "v2", {}, version=3)
    assert caught.value.field == "version"


@aio
async def test_run_job_refuses_what_a_worker_could_not_run():
    registry = registry_of(ok=lambda ctx, payload: None)
    with pytest.raises(pgworker.ValidationError) as caught:
        await run_job(registry, "missing")
    assert caught.value.field == "type" and "'ok'" in str(caught.value)
    with pytest.raises(pgworker.ValidationError) as caught:
        await run_job(registry, "ok", {"when": datetime.now(UTC)})
    assert caught.value.field == "payload"
    with pytest.raises(pgworker.ValidationError) as caught:
        await run_job(registry, "ok", attempt=0)
    assert caught.value.field == "attempt"


# --- the helpers name a bad argument ---------------------------------------------------------


@pytest.mark.asyncio(loop_scope="session")
async def test_drain_and_run_job_refuse_a_lone_string_where_a_list_of_names_goes(conn):
    """drain(conn, registry, redact_keys="password") took the string as the keys "p", "a", "s",
    ...: the password the handler's error quoted was stored unredacted; queues="default" drained
    the queues "d", "e", "f", ... and left the default queue's jobs pending, silently."""
    from pgworker.testing import drain, run_job

    registry = pgworker.Registry()

    @registry.task("leaks", max_retries=0)
    async def leaks(ctx: pgworker.JobContext, payload: dict[str, str]) -> None:
        raise ValueError(f"login failed for {payload['password']}")

    job = (await pgworker.enqueue(conn, "leaks", {"password": "hunter2-secret"})).job.id
    with pytest.raises(pgworker.ValidationError, match="redact_keys") as refused:
        await drain(conn, registry, redact_keys="password")
    assert "['password']" in str(refused.value)
    with pytest.raises(pgworker.ValidationError, match="queues"):
        await drain(conn, registry, queues="default")
    with pytest.raises(pgworker.ValidationError, match="redact_keys"):
        await run_job(registry, "leaks", {"password": "x"}, redact_keys="password")
    assert await status_of(conn, job) == "pending"
    ran = await drain(conn, registry, redact_keys=["password"])
    assert ran.failed == [job] and "hunter2-secret" not in (ran.attempts[0].error or "")


@pytest.mark.asyncio(loop_scope="session")
async def test_the_enqueued_job_helpers_name_the_bad_argument(conn):
    """A NUL or a lone surrogate in `type`, a payload nested too deep or holding a lone
    surrogate: asyncpg's and PostgreSQL's own errors (CharacterNotInRepertoireError, DataError,
    InvalidTextRepresentationError, RecursionError), not a ValidationError naming the field."""
    from pgworker.testing import assert_enqueued, assert_not_enqueued, enqueued_jobs

    deep: list[Any] = []
    for _ in range(3000):
        deep = [deep]
    cases = [
        ("type", enqueued_jobs(conn, type="a\x00b")),
        ("type", enqueued_jobs(conn, type="\ud800")),
        ("queue", enqueued_jobs(conn, queue="q\x00")),
        ("correlation_id", enqueued_jobs(conn, correlation_id="\x00")),
        ("payload", assert_enqueued(conn, type="t", payload=deep)),
        ("payload", assert_not_enqueued(conn, type="t", payload={"\ud800": 1})),
        ("payload_contains", enqueued_jobs(conn, payload_contains={"k": "\x00"})),
    ]
    for field, call in cases:
        with pytest.raises(pgworker.ValidationError) as refused:
            await call
        assert refused.value.field == field
