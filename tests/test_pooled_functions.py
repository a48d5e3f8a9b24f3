"""The pooled functions of pooler mode (`Queries.pooled_functions`) attacked as a hostile user
would, through a real PgBouncer in transaction mode (tests/pgbouncer.py): a worker's role that may
not create them or may not execute them, functions dropped under a running worker, workers
starting together on a schema without them (behind a migration that holds the lock), the lock
timeout they set, and a schema named in mixed case."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import pytest_asyncio

import pgworker
from pgworker._db.connection import create_pool
from pgworker._db.queries import POOLED, _pooled_name, queries

from .helpers import (
    all_finished,
    count_function_calls,
    pooled_calls,
    spawn_worker,
    statuses,
    wait_for,
)
from .pgbouncer import PgBouncer, available

pytestmark = [
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.skipif(
        not available(), reason="needs PgBouncer (/usr/sbin/pgbouncer; apt-get install pgbouncer)"
    ),
]

MADE = "SELECT p.oid::regprocedure::text FROM pg_proc AS p WHERE p.proname LIKE '\\_pooled\\_%'"


@pytest.fixture
def role_name() -> str:
    return f"pgw_pooled_{uuid.uuid4().hex[:8]}"


@pytest_asyncio.fixture(loop_scope="session")
async def worker_role(conn, role_name: str) -> AsyncIterator[str]:
    """A role granted what a worker needs on the pgworker schema's tables, but not CREATE on it."""
    await conn.execute(f"CREATE ROLE {role_name} LOGIN")
    try:
        await conn.execute(
            f"GRANT USAGE ON SCHEMA pgworker TO {role_name}; "
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgworker "
            f"TO {role_name}; "
            f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA pgworker TO {role_name}"
        )
        yield role_name
    finally:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role_name
        )
        await conn.execute(f"DROP OWNED BY {role_name}; DROP ROLE {role_name}")


@pytest.fixture
def bouncer(server_dsn: str, role_name: str) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode that lets in the test's role too (its auth_file names it)."""
    b = PgBouncer(server_dsn, pool_size=4)
    with (b.directory / "users.txt").open("a") as users:
        users.write(f'"{role_name}" ""\n')
    with b:
        yield b


@pytest.fixture
def narrow(server_dsn: str) -> Iterator[PgBouncer]:
    """One server session for every client: what one client leaves there, the next one meets."""
    with PgBouncer(server_dsn, pool_size=1) as b:
        yield b


def pooler_worker(dsn: str, log: Path, *args: str, app: str = "tests.apps.basic") -> Any:
    return spawn_worker(
        app, dsn, log, "--pooler", "--log-format", "json", "--poll-interval", "0.1", *args
    )


def stop(worker: Any) -> int:
    worker.send_signal(signal.SIGTERM)
    try:
        return int(worker.wait(timeout=30))
    finally:
        worker.kill()


def entries(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def as_role(dsn: str, role: str) -> str:
    return dsn.replace("//postgres@", f"//{role}@", 1)


async def pooled_functions(conn) -> list[str]:
    return sorted(r[0] for r in await conn.fetch(MADE))


async def completed(conn, n: int) -> bool:
    return await statuses(conn) == {"completed": n}


async def test_a_worker_whose_role_may_not_create_in_the_schema_runs_plain_statements(
    dsn, conn, worker_role, bouncer, tmp_path
):
    """Without CREATE on the schema the functions cannot be made: the worker says so once, at
    start, and claims and writes outcomes with the plain statements."""
    await pgworker.enqueue_many(conn, [pgworker.JobSpec("echo", {"n": n}) for n in range(20)])
    log = tmp_path / "worker.log"
    worker = pooler_worker(as_role(bouncer.dsn(dsn), worker_role), log)
    try:
        await wait_for(lambda: completed(conn, 20), timeout=60, every=0.1)
        assert worker.poll() is None, log.read_text()[-3000:]
        await pgworker.enqueue(conn, "echo", {"after": "start"})
        await wait_for(lambda: completed(conn, 21), timeout=30, every=0.1)
    finally:
        assert stop(worker) == 0, log.read_text()[-3000:]
    missing = [e for e in entries(log) if e["event"].startswith("pooled functions missing")]
    assert len(missing) == 1, log.read_text()[-3000:]
    assert missing[0]["level"] == "warning" and len(missing[0]["functions"]) == len(POOLED), missing
    assert await pooled_functions(conn) == []
    assert "Traceback" not in log.read_text()


async def test_a_worker_whose_role_may_not_execute_the_functions_runs_plain_statements(
    dsn, conn, worker_role, bouncer, tmp_path
):
    """The owner made them (`migrate --pooler`) under default privileges that give no EXECUTE
    to PUBLIC, a common hardening: the worker's role, granted its tables only, was refused each
    claim ("permission denied for function _pooled_job_claim_..."), no job ever ran. It says
    so once, and runs the plain statements."""
    await conn.execute("ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC")
    try:
        await pgworker.migrate(conn, pooler=True)
    finally:
        await conn.execute("ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO PUBLIC")
    assert len(await pooled_functions(conn)) == len(POOLED)
    await pgworker.enqueue_many(conn, [pgworker.JobSpec("echo", {"n": n}) for n in range(20)])
    log = tmp_path / "worker.log"
    worker = pooler_worker(as_role(bouncer.dsn(dsn), worker_role), log)
    try:
        await wait_for(lambda: completed(conn, 20), timeout=60, every=0.1)
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        assert stop(worker) == 0, log.read_text()[-3000:]
    missing = [e for e in entries(log) if e["event"].startswith("pooled functions missing")]
    assert len(missing) == 1, log.read_text()[-3000:]
    assert len(missing[0]["functions"]) == len(POOLED), missing
    assert "permission denied" not in log.read_text()


async def test_functions_dropped_under_a_running_worker_leave_it_the_plain_statements(
    dsn, conn, bouncer, tmp_path
):
    log = tmp_path / "worker.log"
    worker = pooler_worker(bouncer.dsn(dsn), log)
    try:
        await pgworker.enqueue(conn, "echo", {"before": "drop"})
        await wait_for(lambda: completed(conn, 1), timeout=30, every=0.1)
        made = await pooled_functions(conn)
        assert len(made) == len(POOLED), made
        await conn.execute("; ".join(f"DROP FUNCTION {f}" for f in made))
        # Claimed, heartbeaten (a job longer than the heartbeat) and written after the drop.
        await pgworker.enqueue_many(
            conn,
            [pgworker.JobSpec("echo", {"n": n}) for n in range(50)]
            + [pgworker.JobSpec("sleep", {"seconds": 2.5})],
        )
        await wait_for(lambda: all_finished(conn), timeout=60, every=0.1)
        assert await statuses(conn) == {"completed": 52}
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        assert stop(worker) == 0, log.read_text()[-3000:]
    assert await pooled_functions(conn) == []
    errors = [e for e in entries(log) if e["level"] in ("error", "critical")]
    assert errors == [], errors


async def test_four_workers_starting_together_make_each_function_once(dsn, conn, bouncer, tmp_path):
    """Each worker waits on the migrations' lock (held here as a `migrate` would hold it), then
    reads which functions are missing. Read in the statement that waited, with the snapshot it
    took before the wait, all of them still were, and every worker but the first failed to start
    on DuplicateFunctionError."""
    lock = "SELECT pg_advisory_lock(hashtext('pgworker.migrate'), hashtext('pgworker'))"
    await conn.execute(lock)
    logs = [tmp_path / f"worker{i}.log" for i in range(4)]
    workers = [pooler_worker(bouncer.dsn(dsn), log) for log in logs]
    try:
        waiting = (
            "SELECT count(*) = 4 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        await wait_for(lambda: conn.fetchval(waiting), timeout=60, every=0.05)
        await conn.execute(lock.replace("pg_advisory_lock", "pg_advisory_unlock"))
        registered = "SELECT count(*) = 4 FROM pgworker.workers"
        # All four serving, or one gone (it could not start).
        await wait_for(
            lambda: any(w.poll() is not None for w in workers) or conn.fetchval(registered),
            timeout=60,
        )
        assert [w.poll() for w in workers] == [None] * 4, [log.read_text() for log in logs]
        await pgworker.enqueue_many(conn, [pgworker.JobSpec("echo", {"n": n}) for n in range(40)])
        await wait_for(lambda: completed(conn, 40), timeout=60, every=0.1)
        assert [w.poll() for w in workers] == [None] * 4, [log.read_text() for log in logs]
    finally:
        codes = [stop(w) for w in workers]
    assert codes == [0] * 4, [log.read_text()[-3000:] for log in logs]
    assert len(await pooled_functions(conn)) == len(POOLED)
    for log in logs:
        assert "Traceback" not in log.read_text()
        assert "pooled functions missing" not in log.read_text()


async def test_a_pooled_calls_lock_timeout_holds_in_the_call_and_is_not_left_on_the_session(
    dsn, conn, narrow
):
    """The lock timeout is set for the call's own transaction: a call waiting on a lock fails
    after it, and the one server session behind the pooler keeps the server's setting."""
    pool = await create_pool(narrow.dsn(dsn), size=1, lock_timeout=0.3, pooler=True)
    q = queries("pgworker")
    attempt = (1, 1, datetime(2000, 1, 1, tzinfo=UTC))
    try:
        assert await q.pooled_functions(pool) == []
        async with pool.acquire() as c:
            assert await q.worker_heartbeat(c, [attempt], 30) == {}
        other = await asyncpg.connect(narrow.dsn(dsn), statement_cache_size=0)
        try:  # the same server session, another client
            assert await other.fetchval("SELECT current_setting('lock_timeout')") == "0"
            assert await other.fetchval("SELECT current_setting('enable_seqscan')") == "on"
        finally:
            await other.close()
        async with conn.transaction():
            await conn.execute("LOCK TABLE pgworker.jobs IN ACCESS EXCLUSIVE MODE")
            # Bounded: without its timeout the call would wait for the lock as long as it is held.
            with anyio.fail_after(10):
                async with pool.acquire() as c:
                    with pytest.raises(asyncpg.exceptions.LockNotAvailableError) as refused:
                        await q.worker_heartbeat(c, [attempt], 30)
        # Refused in the function, by the timeout it was passed (the server's is 0).
        assert "_pooled_worker_heartbeat_" in (refused.value.context or ""), refused.value
    finally:
        await pool.close()


async def test_a_mixed_case_schema_gets_its_pooled_functions(empty_dsn, narrow, tmp_path):
    """`--schema` takes any plain identifier, capitals too: quoted in the statements, the
    functions made and called in that schema, not in its lower-case namesake."""
    conn = await asyncpg.connect(empty_dsn)
    schema = "Jobs_Q"
    try:
        await pgworker.migrate(conn, schema=schema, pooler=True)
        names = await conn.fetch(
            "SELECT p.proname FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace "
            "WHERE n.nspname = $1 AND p.proname LIKE '\\_pooled\\_%'",
            schema,
        )
        assert len(names) == len(POOLED)
        job = (await pgworker.enqueue(conn, "echo", {}, schema=schema)).job.id
        log = tmp_path / "worker.log"
        worker = spawn_worker(
            "tests.apps.basic",
            narrow.dsn(empty_dsn),
            log,
            "--pooler",
            "--schema",
            schema,
            "--poll-interval",
            "0.1",
        )
        try:
            await wait_for(
                lambda: conn.fetchval(
                    f"SELECT status = 'completed' FROM \"{schema}\".jobs WHERE id = $1", job
                ),
                timeout=30,
            )
        finally:
            assert stop(worker) == 0, log.read_text()[-3000:]
        assert "pooled functions missing" not in log.read_text()
    finally:
        await conn.close()


async def test_a_function_another_role_made_first_is_never_run(
    dsn, conn, worker_role, bouncer, tmp_path
):
    """The names are known in advance (statement and digest): a role allowed to create in the
    schema could make `_pooled_job_claim_<digest>` first, and every worker, the schema owner's
    included, would have run it with its own privileges. One the schema's owner or the worker's
    own role did not make is left alone: the worker says so once and sends the plain claim."""
    q = queries("pgworker")
    claim = _pooled_name("job_claim", q._sql["job_claim"])
    await conn.execute(
        f"GRANT CREATE ON SCHEMA pgworker TO {worker_role}; "
        "CREATE TABLE public.trojan_ran (at timestamptz)"
    )
    other = await asyncpg.connect(as_role(dsn, worker_role))
    try:
        types = ", ".join(["text[]", "text[]", "integer", "text", "double precision"])
        await other.execute(
            f"CREATE FUNCTION pgworker.{claim}({types}, integer[], text, text, text[], "
            "integer[], boolean, integer[], text) RETURNS SETOF pgworker.jobs LANGUAGE sql "
            "AS $$ INSERT INTO public.trojan_ran VALUES (now()) RETURNING NULL::pgworker.jobs $$"
        )
    finally:
        await other.close()
    await conn.execute(f"GRANT INSERT ON public.trojan_ran TO {worker_role}")
    await pgworker.enqueue_many(conn, [pgworker.JobSpec("echo", {"n": n}) for n in range(20)])
    log = tmp_path / "worker.log"
    worker = pooler_worker(bouncer.dsn(dsn), log)
    try:
        await wait_for(lambda: completed(conn, 20), timeout=60, every=0.1)
    finally:
        assert stop(worker) == 0, log.read_text()[-3000:]
    assert await conn.fetchval("SELECT count(*) FROM public.trojan_ran") == 0
    missing = [e for e in entries(log) if e["event"].startswith("pooled functions missing")]
    assert len(missing) == 1 and missing[0]["functions"] == [claim], log.read_text()[-3000:]


async def test_limited_claims_through_the_pooler_hold_their_limit_as_pooled_calls(
    dsn, conn, bouncer, tmp_path
):
    """A task with `max_running` is claimed in a transaction of its own (limits_lock.sql, then
    job_claim_limited.sql): through the pooler both run as pooled functions inside it, and two
    workers together still run at most `max_running` of its jobs at once."""
    await count_function_calls(conn)
    await pgworker.enqueue_many(
        conn, [pgworker.JobSpec("capped", {"seconds": 0.3}) for _ in range(10)]
    )
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    workers = [
        pooler_worker(bouncer.dsn(dsn), log, "--worker-id", f"w{i}", app="tests.apps.limits")
        for i, log in enumerate(logs)
    ]
    most = 0

    async def drained() -> bool:
        nonlocal most
        running = await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE type = 'capped' AND status = 'running'"
        )
        most = max(most, running)
        return await completed(conn, 10)

    try:
        await wait_for(drained, timeout=60, every=0.02)
    finally:
        for worker, log in zip(workers, logs, strict=True):
            assert stop(worker) == 0, log.read_text()[-3000:]
    assert 1 <= most <= 2, most
    await pooled_calls(conn, "limits_lock", "job_claim_limited")


async def test_a_worker_that_cannot_make_them_in_time_starts_with_the_plain_statements(
    dsn, conn, bouncer, tmp_path
):
    """Making them waits on the migrations' lock, bounded by the worker's lock timeout (a third
    of its lease): held longer by a migration, the wait failed and the worker did not start.
    They are an optimisation: it starts, says why they are missing, and serves."""
    await conn.execute(
        "SELECT pg_advisory_lock(hashtext('pgworker.migrate'), hashtext('pgworker'))"
    )
    log = tmp_path / "worker.log"
    worker = pooler_worker(bouncer.dsn(dsn), log, "--lease", "3")
    try:
        await pgworker.enqueue_many(conn, [pgworker.JobSpec("echo", {"n": n}) for n in range(10)])
        await wait_for(lambda: completed(conn, 10), timeout=60, every=0.1)
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        await conn.execute("SELECT pg_advisory_unlock_all()")
        assert stop(worker) == 0, log.read_text()[-3000:]
    missing = [e for e in entries(log) if e["event"].startswith("pooled functions missing")]
    assert len(missing) == 1, log.read_text()[-3000:]
    assert "LockNotAvailableError" in missing[0]["functions"][0], missing
    assert await pooled_functions(conn) == []
