"""Nothing a handler returns or raises, and no database error, stops a worker (the inputs
refused where they enter are in test_poison_inputs.py).

Each test runs a real worker on a real PostgreSQL, puts a poison job in one claim with plain
jobs, and checks that the poison job ends in its documented state with a readable error, that
the plain jobs of the same claim complete, and that the worker still serves afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import pytest

import pgworker
from pgworker import JobSpec, Worker

from . import helpers
from .helpers import all_finished, attempts, database_of, has_status, serves_on, status_of, wait_for
from .test_chaos import Workers

pytestmark = pytest.mark.asyncio(loop_scope="session")

registry = pgworker.Registry()
runs: list[str] = []


@registry.task("plain")
async def plain(ctx: pgworker.JobContext, payload: Any) -> Any:
    return payload


@registry.task("surrogate-error", max_retries=0)
async def surrogate_error(ctx: pgworker.JobContext, payload: Any) -> None:
    raise ValueError("bad \udcff byte")


@registry.task("surrogate-result")
async def surrogate_result(ctx: pgworker.JobContext, payload: Any) -> Any:
    return {"text": "bad \udcff byte", "key \udcff": 1}


@registry.task("retry-far", max_retries=0)
async def retry_far(ctx: pgworker.JobContext, payload: Any) -> None:
    raise pgworker.Retry(after=1e13)


@registry.task("retry-timedelta-max", max_retries=0)
async def retry_timedelta_max(ctx: pgworker.JobContext, payload: Any) -> None:
    raise pgworker.Retry(after=timedelta.max)


class FarRetry(pgworker.Retry):
    """A Retry whose delay was set after its checks ran: the worker still caps it."""

    def __init__(self) -> None:
        super().__init__(1)
        self.after = 1e13


@registry.task("retry-far-subclass", max_retries=1)
async def retry_far_subclass(ctx: pgworker.JobContext, payload: Any) -> None:
    raise FarRetry()


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


@registry.task("unprintable", max_retries=0)
async def unprintable(ctx: pgworker.JobContext, payload: Any) -> None:
    raise Unprintable()


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@registry.task("deep-result")
async def deep_result(ctx: pgworker.JobContext, payload: Any) -> Any:
    return _nested(5000)


@registry.task("refused-result")
async def refused_result(ctx: pgworker.JobContext, payload: Any) -> Any:
    return {"poison": True}


@registry.task("own-cancel", max_retries=0)
async def own_cancel(ctx: pgworker.JobContext, payload: Any) -> None:
    """Awaits a sub-task it cancelled itself: CancelledError, which the worker did not cause."""
    sub = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0)
    sub.cancel()
    await sub


RAISED = {
    "system-exit": SystemExit(3),
    "keyboard-interrupt": KeyboardInterrupt(),
    "generator-exit": GeneratorExit(),
    "bare-base-exception": BaseException("bare"),
}


def _raising(exc: BaseException) -> Any:
    async def handler(ctx: pgworker.JobContext, payload: Any) -> None:
        raise exc

    return handler


for _name, _exc in RAISED.items():
    registry.task(_name, max_retries=0)(_raising(_exc))


@registry.task("sync-sys-exit", max_retries=0)
def sync_sys_exit(ctx: pgworker.JobContext, payload: Any) -> None:
    sys.exit(4)


@registry.task("mail-only", queue="mail")
async def mail_only(ctx: pgworker.JobContext, payload: Any) -> str:
    return "sent"


gate: dict[str, anyio.Event] = {}


@registry.task("stubborn", max_retries=0)
async def stubborn(ctx: pgworker.JobContext, payload: Any) -> str:
    """Ignores every cancellation until the test lets it go."""
    while not gate["release"].is_set():
        with contextlib.suppress(asyncio.CancelledError):
            await gate["release"].wait()
    return "let go"


@registry.task("held")
async def held(ctx: pgworker.JobContext, payload: Any) -> str:
    await gate["open"].wait()
    return "done"


@contextlib.asynccontextmanager
async def serving(dsn: str, **options: Any) -> AsyncIterator[Worker]:
    options.setdefault("poll_interval", 0.05)
    async with Worker(registry, dsn, concurrency=10, **options) as worker:
        yield worker


async def poison_in_a_claim(
    dsn: str, conn: asyncpg.Connection, type_: str, payload: Any = None
) -> pgworker.Job:
    return await helpers.poison_in_a_claim(serving(dsn), conn, type_, payload)


# --- A: poison outcomes -------------------------------------------------------------------


async def test_A_lone_surrogate_in_an_error_message(dsn, conn):
    job = await poison_in_a_claim(dsn, conn, "surrogate-error")
    assert job.status == "failed"
    assert job.error == "ValueError: bad \ufffd byte"
    rows = await attempts(conn, job.id)
    assert [(r["outcome"], r["error_message"]) for r in rows] == [("failed", "bad \ufffd byte")]


async def test_A_lone_surrogate_in_a_return_value(dsn, conn):
    job = await poison_in_a_claim(dsn, conn, "surrogate-result")
    assert job.status == "completed"
    assert job.result == {"text": "bad \ufffd byte", "key \ufffd": 1}


@pytest.mark.parametrize("type_", ["retry-far", "retry-timedelta-max"])
async def test_A_retry_after_beyond_any_timestamp(dsn, conn, type_):
    job = await poison_in_a_claim(dsn, conn, type_)
    assert job.status == "failed"
    # Retry(after=...) refuses the value (the handler's failure), or the worker caps the delay
    assert job.error is not None
    assert job.error.startswith(("ValidationError: after", "Retry: "))


async def test_A_a_delay_set_past_the_checks_is_capped(dsn, conn):
    poison = await pgworker.enqueue(conn, "retry-far-subclass", {})
    async with serving(dsn):
        await wait_for(lambda: has_status(conn, poison.job.id, "pending"), timeout=20)
        await wait_for(
            lambda: conn.fetchval(
                "SELECT attempts = 1 AND run_at > now() + interval '9 years'"
                " FROM pgworker.jobs WHERE id = $1",
                poison.job.id,
            ),
            timeout=20,
        )
        await serves_on(conn)


async def test_A_a_refused_row_does_not_take_its_batch_down(dsn, conn):
    """The database refuses one outcome of a batch (here a constraint of the user's own): the
    other outcomes are written, and the refused one is recorded as a failed attempt."""
    await conn.execute(
        "ALTER TABLE pgworker.jobs ADD CONSTRAINT no_poison"
        " CHECK (result IS NULL OR NOT result ? 'poison')"
    )
    job = await poison_in_a_claim(dsn, conn, "refused-result")
    assert job.status == "failed"
    assert job.error is not None and job.error.startswith("OutcomeRefused:")
    assert "no_poison" in job.error
    rows = await attempts(conn, job.id)
    assert [(r["outcome"], r["error_type"]) for r in rows] == [("failed", "OutcomeRefused")]


# --- B: a worker never holds two attempts of one job ---------------------------------------


@pytest.fixture
def procs(dsn: str, tmp_path):
    w = Workers(dsn, tmp_path, "tests.apps.poison")
    yield w
    for p in w.procs:
        if p.poll() is None:
            p.kill()
            p.wait()


async def leader(conn: asyncpg.Connection) -> str | None:
    return await conn.fetchval(
        "SELECT worker_id FROM pgworker.leader WHERE name = 'maintenance' AND expires_at > now()"
    )


async def test_B_a_worker_frozen_past_its_lease_stops_its_stale_attempt(dsn, conn, procs):
    # b leads maintenance and serves another queue only: it rescues the job, never claims it.
    procs.start("b", "--lease", "1", "--queue", "elsewhere")
    await wait_for(lambda: _leads(conn, "b"), timeout=30)
    r = await pgworker.enqueue(conn, "work", {"ms": 4000})
    a = procs.start("a", "--lease", "1")
    await wait_for(lambda: has_status(conn, r.job.id, "running"), timeout=30)
    a.send_signal(signal.SIGSTOP)
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'pending' AND attempts = 1 FROM pgworker.jobs WHERE id = $1",
                r.job.id,
            ),
            timeout=30,
        )
    finally:
        a.send_signal(signal.SIGCONT)
    await wait_for(lambda: has_status(conn, r.job.id, "completed"), timeout=60)
    rows = await attempts(conn, r.job.id)
    assert [(x["worker_id"], x["outcome"]) for x in rows] == [("a", "lost"), ("a", "completed")]
    # Stopped as it wakes: by its fence (no heartbeat answered for most of the lease), or by the
    # heartbeat or the claim that finds the lease gone.
    assert any(
        line in procs.log("a")
        for line in ("lost contact with the database", "lease lost: stopping the attempt")
    )
    after = await pgworker.enqueue(conn, "work", {"ms": 0})
    await wait_for(lambda: has_status(conn, after.job.id, "completed"), timeout=30)
    assert a.poll() is None
    assert procs.stop_all() == [0, 0]
    assert "KeyError" not in procs.log("a")
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE status = 'failed'") == 0


async def _leads(conn: asyncpg.Connection, worker_id: str) -> bool:
    return await leader(conn) == worker_id


# --- C, D: handlers raising what is not an Exception -----------------------------------------


async def test_C_a_handler_raising_its_own_cancelled_error(dsn, conn):
    job = await poison_in_a_claim(dsn, conn, "own-cancel")
    assert job.status == "failed"
    assert job.error is not None and job.error.startswith("CancelledError")


async def test_D_an_exception_whose_str_raises(dsn, conn):
    job = await poison_in_a_claim(dsn, conn, "unprintable")
    assert job.status == "failed"
    assert job.error is not None and job.error.startswith("Unprintable: <")
    assert "RuntimeError" in job.error


async def test_D_a_return_value_nested_5000_deep(dsn, conn):
    job = await poison_in_a_claim(dsn, conn, "deep-result")
    assert (job.status, job.result) == ("completed", None)


@pytest.mark.parametrize("type_", [*RAISED, "sync-sys-exit"])
async def test_D_base_exceptions_raised_by_a_handler_are_its_failure(dsn, conn, type_):
    job = await poison_in_a_claim(dsn, conn, type_)
    assert job.status == "failed"
    expected = {
        "system-exit": "SystemExit: 3",
        "keyboard-interrupt": "KeyboardInterrupt",
        "generator-exit": "GeneratorExit",
        "bare-base-exception": "BaseException: bare",
        "sync-sys-exit": "SystemExit: 4",
    }[type_]
    assert job.error == expected


# --- E: database errors other than a lost connection ---------------------------------------


async def _hold_row_lock(dsn: str, job_id: int) -> tuple[asyncpg.Connection, Any]:
    locker = await asyncpg.connect(dsn)
    tx = locker.transaction()
    await tx.start()
    await locker.execute("SELECT FROM pgworker.jobs WHERE id = $1 FOR UPDATE", job_id)
    return locker, tx


async def _completer_waiting_on_a_lock(conn: asyncpg.Connection) -> int | None:
    return await conn.fetchval(
        """SELECT pid FROM pg_stat_activity
           WHERE application_name LIKE 'pgworker:%' AND wait_event_type = 'Lock'
             AND datname = current_database()
             AND query LIKE '-- Write a batch of attempt outcomes%'"""
    )


async def _run_blocked_outcome(dsn: str, conn: asyncpg.Connection, unblock) -> None:
    """A job whose outcome write waits on a row lock the test holds: `unblock` makes the write
    fail (without ending the connection); the worker retries and writes it once the lock goes."""
    gate["open"] = anyio.Event()
    r = await pgworker.enqueue(conn, "held", {})
    async with serving(dsn, lease=5) as worker:
        await wait_for(lambda: has_status(conn, r.job.id, "running"), timeout=20)
        locker, tx = await _hold_row_lock(dsn, r.job.id)
        gate["open"].set()
        try:
            pid = await wait_for(lambda: _completer_waiting_on_a_lock(conn), timeout=20)
            await unblock(conn, pid)
            await wait_for(
                lambda: worker.health()["completer"]["consecutive_failures"] > 0, timeout=20
            )
            assert worker.health()["completer"]["state"] == "retrying"
        finally:
            await tx.rollback()
            await locker.close()
        await wait_for(lambda: has_status(conn, r.job.id, "completed"), timeout=30)
        await wait_for(lambda: worker.health()["completer"]["state"] == "ok", timeout=20)
        await serves_on(conn)


async def test_E_statement_timeout_on_an_outcome_write(dsn, conn):
    db_name = database_of(dsn)
    await conn.execute(f"ALTER DATABASE \"{db_name}\" SET statement_timeout = '300ms'")

    async def nothing(conn: asyncpg.Connection, pid: int) -> None:
        pass  # the server's statement_timeout cancels the write

    await _run_blocked_outcome(dsn, conn, nothing)


async def test_E_pg_cancel_backend_of_the_outcome_write(dsn, conn):
    async def cancel(conn: asyncpg.Connection, pid: int) -> None:
        assert await conn.fetchval("SELECT pg_cancel_backend($1)", pid)

    await _run_blocked_outcome(dsn, conn, cancel)


@contextlib.asynccontextmanager
async def role(
    conn: asyncpg.Connection, dsn: str, *, limit: int = -1, grant: bool = True
) -> AsyncIterator[str]:
    """A login role of the test's own, with all privileges on the schema unless not `grant`;
    yields its DSN."""
    name = f"pgw_role_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"CREATE ROLE {name} LOGIN CONNECTION LIMIT {limit}")
    if grant:
        await conn.execute(f"GRANT USAGE ON SCHEMA pgworker TO {name}")
        await conn.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgworker TO {name}"
        )
    try:
        yield dsn.replace("//postgres@", f"//{name}@", 1)
    finally:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", name
        )
        await conn.execute(f"DROP OWNED BY {name}")
        await conn.execute(f"DROP ROLE {name}")


async def test_E_too_many_connections_for_the_role(dsn, conn):
    """The role may hold 2 connections: a worker without LISTEN needs no more (its claims, and
    the connection its outcomes, heartbeat and maintenance share), so its jobs complete and no
    service ever meets the limit. (With a pool of 4, the heartbeat and the maintenance met it
    and retried.)"""
    jobs = await pgworker.enqueue_many(conn, [JobSpec("plain", {"n": n}) for n in range(20)])
    async with (
        role(conn, dsn, limit=2) as role_dsn,
        serving(role_dsn, listen=False, lease=0.6) as worker,
    ):
        seen: set[str] = set()

        def finished_watching() -> Any:
            seen.update(h["last_error"] or "" for h in worker.health().values())
            return all_finished(conn)

        await wait_for(finished_watching, timeout=30)
        done_at = await conn.fetchval("SELECT now()")

        async def beat_twice_since() -> bool:
            seen.update(h["last_error"] or "" for h in worker.health().values())
            last = await conn.fetchval("SELECT max(last_seen_at) FROM pgworker.workers")
            return bool(last > done_at + timedelta(seconds=0.3))

        await wait_for(beat_twice_since, timeout=10)
        assert not [e for e in seen if "TooManyConnections" in e]
    for r in jobs:
        assert await status_of(conn, r.job.id) == "completed"


# --- F: a payload nested too deep to decode ------------------------------------------------


@pytest.mark.parametrize("depth", [985, 5000])
async def test_F_a_payload_nested_too_deep_written_around_enqueue(dsn, conn, depth):
    job_id = await conn.fetchval(
        "INSERT INTO pgworker.jobs (type, payload) VALUES ('plain', $1::jsonb) RETURNING id",
        "[" * depth + "]" * depth,
    )
    others = await pgworker.enqueue_many(conn, [JobSpec("plain", {"n": n}) for n in range(3)])
    async with serving(dsn):
        await wait_for(lambda: all_finished(conn), timeout=20)
        await serves_on(conn)
    for r in others:
        assert await status_of(conn, r.job.id) == "completed"
    status, error = await conn.fetchrow(
        "SELECT status, error FROM pgworker.jobs WHERE id = $1", job_id
    )
    # Python's json may decode 985 levels, depending on the stack in use; 5000 it cannot.
    if depth > 1000 or status == "failed":
        assert status == "failed"
        assert error.startswith("InvalidPayload: the payload cannot be decoded")
    else:
        assert status == "completed"


# --- G: start-up ---------------------------------------------------------------------------


async def test_G_a_missing_privilege_is_a_privilege_error_naming_it(dsn, conn):
    async with role(conn, dsn, grant=False) as role_dsn:
        name = role_dsn.split("://", 1)[1].split("@", 1)[0]
        await conn.execute(f"GRANT USAGE ON SCHEMA pgworker TO {name}")
        await conn.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON pgworker.jobs, pgworker.job_attempts,"
            f" pgworker.leader, pgworker.migrations TO {name}"
        )
        with pytest.raises(pgworker.PrivilegeError, match="workers"):
            with anyio.CancelScope():
                async with serving(role_dsn):
                    pytest.fail("the worker started without its privileges")
        with pytest.raises(ExceptionGroup) as group:
            async with anyio.create_task_group(), serving(role_dsn):
                pytest.fail("the worker started without its privileges")
        assert [type(e) for e in group.value.exceptions] == [pgworker.PrivilegeError]
        assert not await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", name
        )


async def test_G_no_privilege_on_the_schema_itself(dsn, conn):
    async with role(conn, dsn, grant=False) as role_dsn:
        with pytest.raises(pgworker.PrivilegeError):
            async with serving(role_dsn):
                pytest.fail("the worker started without its privileges")


async def test_G_role_connection_limit_at_start_is_database_unavailable(dsn, conn):
    async with role(conn, dsn, limit=1) as role_dsn:
        name = role_dsn.split("://", 1)[1].split("@", 1)[0]
        with pytest.raises(pgworker.DatabaseUnavailable, match="refuses more connections"):
            with anyio.CancelScope():
                async with serving(role_dsn):  # the pool takes 1, the listener is refused
                    pytest.fail("the worker started beyond its connection limit")
        await wait_for(
            lambda: _no_sessions(conn, name),
            timeout=10,
        )


async def _no_sessions(conn: asyncpg.Connection, role_name: str) -> bool:
    return not await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", role_name
    )


async def test_G_an_error_in_the_block_keeps_its_type_inside_a_task_group(dsn, conn):
    with pytest.raises(ExceptionGroup) as group:
        async with anyio.create_task_group(), serving(dsn):
            raise KeyError("mine")
    assert [repr(e) for e in group.value.exceptions] == ["KeyError('mine')"]
    with pytest.raises(KeyError, match="mine"), anyio.CancelScope():
        async with serving(dsn):
            raise KeyError("mine")


# --- H: the queues a task names are served by default --------------------------------------


async def test_H_a_task_of_another_queue_is_served_by_default(dsn, conn):
    mail = await pgworker.enqueue(conn, "mail-only", {}, queue="mail")
    async with serving(dsn) as worker:
        assert set(worker.settings.queues) >= {"default", "mail"}
        await wait_for(lambda: has_status(conn, mail.job.id, "completed"), timeout=20)


async def test_H_pgworker_run_serves_every_queue_of_its_registry(dsn, conn, procs):
    mail = await pgworker.enqueue(conn, "mail-only", {}, queue="mail")
    procs.start("a")
    await wait_for(lambda: has_status(conn, mail.job.id, "completed"), timeout=30)
    assert procs.stop_all() == [0]


# --- J: a sync handler that never returns ----------------------------------------------------


async def test_J_a_sync_handler_that_never_returns_does_not_keep_the_process(dsn, conn, procs):
    r = await pgworker.enqueue(conn, "forever-sync", {})
    a = procs.start("a", "--shutdown-timeout", "0.5")
    await wait_for(lambda: has_status(conn, r.job.id, "running"), timeout=30)
    a.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert await anyio.to_thread.run_sync(lambda: a.wait(timeout=20)) == 0
    assert time.monotonic() - started < 20
    assert await status_of(conn, r.job.id) == "pending"
    assert [x["outcome"] for x in await attempts(conn, r.job.id)] == ["interrupted"]


async def test_J_an_async_handler_ignoring_its_cancellation_is_abandoned(dsn, conn):
    """An embedded worker stops within the grace period plus ABANDON_AFTER, hands the job back,
    and counts the abandoned handler."""
    from pgworker._runtime.producer import ABANDON_AFTER

    gate["release"] = anyio.Event()
    r = await pgworker.enqueue(conn, "stubborn", {})
    try:
        with anyio.fail_after(ABANDON_AFTER + 10):
            async with serving(dsn, shutdown_timeout=0.2) as worker:
                await wait_for(lambda: has_status(conn, r.job.id, "running"), timeout=20)
        assert worker.abandoned == 1
        assert await status_of(conn, r.job.id) == "pending"
        assert [x["outcome"] for x in await attempts(conn, r.job.id)] == ["interrupted"]
    finally:
        gate["release"].set()


# --- N: a frozen maintenance leader loses its leadership within the lease -------------------


async def test_N_a_leader_frozen_at_any_point_of_its_cycle_is_replaced(
    dsn, conn, procs, tmp_path, monkeypatch
):
    """Under load, the leader is frozen (SIGSTOP) at three points of its cycle, each twice: just
    after renewing its lease, holding the expired jobs it is about to rescue, and idle. The
    leader reaching the point says so (tests/apps/poison.py, a barrier), so each freeze is
    exactly there. Each time the other worker takes the lease and rescues an expired job."""
    barriers = tmp_path / "freeze"
    barriers.mkdir()
    monkeypatch.setenv("POISON_FREEZE_DIR", str(barriers))
    await pgworker.enqueue_many(conn, [JobSpec("work", {"ms": 5}) for _ in range(3000)])
    names = {"a": procs.start("a", "--lease", "1"), "b": procs.start("b", "--lease", "1")}
    by_pid = {p.pid: name for name, p in names.items()}
    pid_file = barriers / "pid"
    try:
        for point in ("renewed", "expired", "idle") * 2:
            await wait_for(lambda: leader(conn), timeout=60)
            (barriers / "armed.tmp").write_text(point)
            (barriers / "armed.tmp").rename(barriers / "armed")
            await wait_for(pid_file.exists, timeout=60, every=0.005)
            current = by_pid[int(pid_file.read_text())]
            frozen = names[current]
            frozen.send_signal(signal.SIGSTOP)
            try:
                ghost = await conn.fetchval(
                    """INSERT INTO pgworker.jobs (type, payload, status, attempts, claimed_at,
                           worker_id, lease_expires_at)
                       VALUES ('work', '{}', 'running', 1, now(), 'ghost', now())
                       RETURNING id"""
                )
                await conn.execute(
                    """INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue,
                           worker_id, correlation_id) VALUES ($1, 1, 'work', 'default', 'ghost',
                           'c')""",
                    ghost,
                )
                other = "b" if current == "a" else "a"
                await wait_for(lambda other=other: _leads(conn, other), timeout=60)
                await wait_for(
                    lambda ghost=ghost: conn.fetchval(
                        "SELECT outcome = 'lost' FROM pgworker.job_attempts WHERE job_id = $1",
                        ghost,
                    ),
                    timeout=60,
                )
            finally:
                frozen.send_signal(signal.SIGCONT)
                pid_file.unlink()
                (barriers / "reached").unlink()
        assert [p.poll() for p in procs.procs] == [None, None]
    finally:
        codes = procs.stop_all()
    assert codes == [0, 0]


# --- the supervised loop -------------------------------------------------------------------


async def test_an_unexpected_error_restarts_the_service_not_the_process(dsn, conn, monkeypatch):
    """A bug in a service's step (here the heartbeat's statement raising RuntimeError twice) is
    logged, the service retried after the backoff, and its health says so meanwhile."""
    from pgworker._db.queries import Queries

    calls = {"n": 0}
    real = Queries.worker_heartbeat

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise RuntimeError("a bug")
        return await real(*args, **kwargs)

    monkeypatch.setattr(Queries, "worker_heartbeat", flaky)
    async with serving(dsn, lease=1) as worker:
        await wait_for(lambda: worker.health()["heartbeat"]["state"] == "retrying", every=0.001)
        await wait_for(lambda: calls["n"] > 2 and worker.health()["heartbeat"]["state"] == "ok")
        health = worker.health()["heartbeat"]
        assert health["last_error"] == "RuntimeError: a bug"
        assert health["consecutive_failures"] == 0 and health["last_success"] is not None
        await serves_on(conn)
    assert {h["state"] for h in worker.health().values()} == {"stopped"}
