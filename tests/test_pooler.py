"""Pooler mode through a real PgBouncer in transaction mode (tests/pgbouncer.py), started by each
test on a free port of 127.0.0.1: `pgworker run --pooler` runs jobs, survives PgBouncer's
restart, rescues a killed worker's job and gets cancel requests; the CLI and Python's enqueue
work through it client after client; a worker or command without --pooler says to pass it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import asyncpg
import pytest

import pgworker
from pgworker._db.connection import create_pool

from .helpers import (
    ROOT,
    all_finished,
    attempts,
    cli,
    cli_process,
    count_function_calls,
    pooled_calls,
    spawn_worker,
    statuses,
    wait_for,
)
from .pgbouncer import PgBouncer, available
from .webserver import free_port

pytestmark = [
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.skipif(
        not available(), reason="needs PgBouncer (/usr/sbin/pgbouncer; apt-get install pgbouncer)"
    ),
]

ONE_LINE_POOLER = "turn pooler mode on: --pooler"


@pytest.fixture
def bouncer(server_dsn: str) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode, refusing unknown startup parameters (its default)."""
    with PgBouncer(server_dsn, pool_size=4) as b:
        yield b


@pytest.fixture
def narrow(server_dsn: str) -> Iterator[PgBouncer]:
    """One server connection for every client: each client gets the session the one before it
    left, with whatever it kept (prepared statements)."""
    with PgBouncer(server_dsn, pool_size=1) as b:
        yield b


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PGWORKER_", "DATABASE_URL"))}
    e["PYTHONPATH"] = str(ROOT)
    return e


def pooler_worker(dsn: str, log, *args: str) -> subprocess.Popen[bytes]:
    return spawn_worker("tests.apps.basic", dsn, log, "--pooler", "--log-format", "json", *args)


def stop(worker: subprocess.Popen[bytes]) -> int:
    worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(timeout=30)
    finally:
        worker.kill()


async def running_job(conn, job_id: int) -> bool:
    return await conn.fetchval("SELECT status = 'running' FROM pgworker.jobs WHERE id = $1", job_id)


async def test_a_pooler_worker_runs_1000_jobs(dsn, conn, bouncer, tmp_path):
    await pgworker.enqueue_many(conn, [pgworker.JobSpec("echo", {"n": n}) for n in range(1000)])
    log = tmp_path / "worker.log"
    worker = pooler_worker(
        bouncer.dsn(dsn), log, "--poll-interval", "0.1", "--log-level", "warning"
    )
    try:
        await wait_for(lambda: all_finished(conn), timeout=120, every=0.2)
        assert worker.poll() is None, log.read_text()
        assert await statuses(conn) == {"completed": 1000}
        assert await conn.fetchval("SELECT count(*) FROM pgworker.job_attempts") == 1000
    finally:
        assert stop(worker) == 0, log.read_text()[-3000:]


async def test_a_pooler_workers_claims_and_outcomes_run_as_the_schemas_pooled_functions(
    dsn, conn, bouncer, tmp_path
):
    """Through a pooler no statement stays prepared: a claim sent as itself was parsed and
    planned at every execution (about 1 ms of the server's CPU, 58% of the direct rate in
    `make bench`). The worker's claims and outcome writes run as PL/pgSQL functions of the
    schema instead, whose plans each server session keeps."""
    await count_function_calls(conn)
    await pgworker.enqueue_many(conn, [pgworker.JobSpec("echo", {"n": n}) for n in range(200)])
    log = tmp_path / "worker.log"
    worker = pooler_worker(bouncer.dsn(dsn), log, "--poll-interval", "0.1")
    try:
        await wait_for(lambda: all_finished(conn), timeout=60, every=0.2)
    finally:
        assert stop(worker) == 0, log.read_text()[-3000:]
    assert await statuses(conn) == {"completed": 200}
    await pooled_calls(conn, "job_claim", "job_finish_many")


async def test_a_pooler_worker_survives_a_pgbouncer_restart(dsn, conn, bouncer, tmp_path):
    n = 600
    await pgworker.enqueue_many(
        conn, [pgworker.JobSpec("sleep", {"seconds": 0.02}) for _ in range(n)]
    )
    log = tmp_path / "worker.log"
    worker = pooler_worker(bouncer.dsn(dsn), log, "--poll-interval", "0.1", "--lease", "3")
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) >= 50 FROM pgworker.jobs WHERE status = 'completed'"
            ),
            timeout=60,
        )
        bouncer.kill()
        done_at_kill = (await statuses(conn)).get("completed", 0)
        bouncer.start()
        assert done_at_kill < n, "the jobs were done before the restart: nothing was proven"
        await wait_for(lambda: all_finished(conn), timeout=120, every=0.2)
        assert worker.poll() is None, log.read_text()[-3000:]
        assert await statuses(conn) == {"completed": n}
    finally:
        assert stop(worker) == 0, log.read_text()[-3000:]


async def test_a_pooler_workers_maintenance_rescues_a_killed_workers_job(
    dsn, conn, bouncer, tmp_path
):
    job = (await pgworker.enqueue(conn, "sleep", {"seconds": 2})).job.id
    first = pooler_worker(bouncer.dsn(dsn), tmp_path / "first.log", "--lease", "2")
    try:
        await wait_for(lambda: running_job(conn, job), timeout=30)
    finally:
        first.kill()
        first.wait(timeout=10)
    log = tmp_path / "second.log"
    second = pooler_worker(bouncer.dsn(dsn), log, "--lease", "2", "--poll-interval", "0.1")
    try:
        await wait_for(lambda: all_finished(conn), timeout=60, every=0.1)
        assert [a["outcome"] for a in await attempts(conn, job)] == ["lost", "completed"]
        rescued = [json.loads(line) for line in log.read_text().splitlines() if "rescued" in line]
        assert rescued and rescued[0]["job_id"] == job, log.read_text()[-3000:]
    finally:
        assert stop(second) == 0, log.read_text()[-3000:]


async def test_cancel_reaches_a_running_job_through_the_pooler(dsn, conn, bouncer, tmp_path):
    """Without --listen-dsn no LISTEN: the request reaches the job at the next heartbeat."""
    job = (await pgworker.enqueue(conn, "sleep", {"seconds": 60})).job.id
    log = tmp_path / "worker.log"
    worker = pooler_worker(bouncer.dsn(dsn), log, "--lease", "3", "--poll-interval", "0.1")
    try:
        await wait_for(lambda: running_job(conn, job), timeout=30)
        out = cli("cancel", str(job), "--pooler", "--dsn", bouncer.dsn(dsn))
        assert out.stdout == f"job {job} is running: its worker was asked to stop it\n", out
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'cancelled' FROM pgworker.jobs WHERE id = $1", job
            ),
            timeout=15,
        )
        assert [a["outcome"] for a in await attempts(conn, job)] == ["cancelled"]
    finally:
        assert stop(worker) == 0, log.read_text()[-3000:]


async def test_a_pooler_worker_wakes_on_listen_dsn_rather_than_polling(
    dsn, conn, bouncer, tmp_path
):
    log = tmp_path / "worker.log"
    worker = pooler_worker(bouncer.dsn(dsn), log, "--poll-interval", "600", "--listen-dsn", dsn)
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 1 FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name LIKE 'pgworker-listen:%'"
            ),
            timeout=30,
        )
        job = (await pgworker.enqueue(conn, "echo", {})).job.id
        # Well within the 10 s a listener that hears nothing takes to notice and reconnect (its
        # reconnection wakes the worker too): a NOTIFY heard.
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'completed' FROM pgworker.jobs WHERE id = $1", job
            ),
            timeout=4,
        )
    finally:
        assert stop(worker) == 0, log.read_text()[-3000:]


async def test_the_cli_works_through_the_pooler_client_after_client(empty_dsn, narrow, tmp_path):
    """Through one server connection each command gets the session the last one left: one that
    kept a prepared statement would break the next ("after the first client")."""
    through = narrow.dsn(empty_dsn)

    def ok(*args: str) -> str:
        out = cli(*args, "--pooler", "--dsn", through)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out.stdout

    assert ok("migrate").startswith("applied migrations [")
    assert ok("migrate") == "schema is up to date\n"
    pending = json.loads(ok("enqueue", "echo", "--delay", "3600"))["id"]
    failing = json.loads(ok("enqueue", "fail"))["id"]
    assert "pending" in ok("status")
    assert ok("cancel", str(pending)) == f"job {pending} cancelled (it was pending)\n"
    log = tmp_path / "worker.log"
    worker = pooler_worker(through, log, "--poll-interval", "0.1")
    conn = await asyncpg.connect(empty_dsn)
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'failed' FROM pgworker.jobs WHERE id = $1", failing
            ),
            timeout=30,
        )
        assert stop(worker) == 0, log.read_text()[-3000:]
        assert f"{failing}" in ok("failed", "list")
        assert '"status": "failed"' in ok("show", str(failing), "--json")
        ok("replay", str(failing), "--reason", "through the pooler")
        assert await conn.fetchval("SELECT status FROM pgworker.jobs WHERE id = $1", failing) == (
            "pending"
        )
        locks = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        assert locks == 0
    finally:
        worker.kill()
        await conn.close()


async def test_a_command_without_pooler_says_to_pass_it(dsn, narrow):
    """Two processes: each names its prepared statements from 1 (one process's second client
    would take names the server session does not hold yet)."""
    first = cli_process("enqueue", "echo", "--dsn", narrow.dsn(dsn))
    assert first.returncode == 0, first.stderr  # the first client alone does not see it
    second = cli_process("enqueue", "echo", "--dsn", narrow.dsn(dsn))
    assert second.returncode == 2, second
    assert ONE_LINE_POOLER in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr


PYTHON_CLIENT = textwrap.dedent(
    """
    import asyncio, sys
    import asyncpg, pgworker

    async def main():
        # What docs/operations/poolers.md tells a service to do with its own pool.
        pool = await asyncpg.create_pool(sys.argv[1], statement_cache_size=0)
        async with pool.acquire() as conn:
            await pgworker.enqueue(conn, "echo", {"one": 1})
            async with conn.transaction():
                await pgworker.enqueue(conn, "echo", {"two": 2}, idempotency_key=sys.argv[2])
            jobs = [pgworker.JobSpec("echo", {"n": n}) for n in range(3)]
            await pgworker.enqueue_many(conn, jobs)
        await pool.close()

    asyncio.run(main())
    """
)


async def test_python_enqueue_through_the_pooler_client_after_client(dsn, conn, narrow):
    for client in ("a", "b"):
        out = subprocess.run(
            [sys.executable, "-c", PYTHON_CLIENT, narrow.dsn(dsn), client],
            capture_output=True,
            text=True,
            env=env(),
            cwd=ROOT,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
    assert await statuses(conn) == {"pending": 10}


SERVE = ("serve", "--insecure-no-auth", "--host", "127.0.0.1", "--no-maintenance", "--port")


@pytest.mark.parametrize(
    "command",
    [("run", "tests.apps.basic"), (*SERVE, str(free_port()))],
    ids=["run", "serve"],
)
async def test_a_worker_without_pooler_exits_with_one_line_naming_it(
    dsn, server_dsn, bouncer, command
):
    """PgBouncer refuses the worker's startup parameters; told to ignore them, it drops them:
    either way the worker (and `serve`, whose pool has the same options) says to pass --pooler,
    with the exit status of a configuration error."""
    out = cli_process(*command, "--dsn", bouncer.dsn(dsn), timeout=30)
    assert out.returncode == 2, out
    assert "unsupported startup parameter" in out.stderr and ONE_LINE_POOLER in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    ignoring = PgBouncer(
        server_dsn,
        ignore_startup_parameters="plan_cache_mode,enable_bitmapscan,enable_seqscan,jit,lock_timeout",
    )
    with ignoring:
        out = cli_process(*command, "--dsn", ignoring.dsn(dsn), timeout=30)
    assert out.returncode == 2, out
    assert "plan_cache_mode was ignored" in out.stderr and ONE_LINE_POOLER in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


async def test_pooler_sessions_get_the_settings_in_each_transaction_only(dsn, narrow):
    """What a direct pool sets at connection, a pooler pool sets in each transaction: never
    left on the server session for the next client."""
    pool = await create_pool(narrow.dsn(dsn), size=2, lock_timeout=1.5, pooler=True)
    try:
        assert await pool.fetchval("SELECT current_setting('lock_timeout')") == "1500ms"
        assert await pool.fetchval("SELECT current_setting('enable_bitmapscan')") == "off"
        assert await pool.fetchval("SELECT current_setting('plan_cache_mode')") == "auto"
    finally:
        await pool.close()
    other = await asyncpg.connect(narrow.dsn(dsn), statement_cache_size=0)
    try:  # the same server session (one in PgBouncer's pool), another client
        assert await other.fetchval("SELECT current_setting('lock_timeout')") == "0"
        assert await other.fetchval("SELECT current_setting('enable_bitmapscan')") == "on"
    finally:
        await other.close()


async def test_migrate_in_pooler_mode_holds_a_transaction_level_lock(empty_dsn):
    """Through a pooler a session lock would stay on whichever server session took it: pooler
    mode's is held by the transaction that applies the migrations, gone when it ends."""
    conn = await asyncpg.connect(empty_dsn)
    held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    try:
        async with conn.transaction():
            assert await pgworker.migrate(conn, pooler=True)
            assert await conn.fetchval(held) == 1
        assert await conn.fetchval(held) == 0
        assert await pgworker.migrate(conn, pooler=True) == []
    finally:
        await conn.close()


async def test_worker_pooler_option_in_python(dsn, conn, bouncer):
    from .apps.basic import registry
    from .helpers import serving_guarded

    job = (await pgworker.enqueue(conn, "echo", {"in": "python"})).job.id
    async with serving_guarded(registry, bouncer.dsn(dsn), pooler=True) as worker:
        assert worker.settings.pooler and "notifier" not in worker.health()
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'completed' FROM pgworker.jobs WHERE id = $1", job
            ),
            timeout=20,
        )


async def test_pooler_settings_from_the_environment_and_their_repr():
    settings = pgworker.Settings.from_env(
        {
            "PGWORKER_DSN": "postgresql://app@pgbouncer:6432/app",
            "PGWORKER_POOLER": "yes",
            "PGWORKER_LISTEN_DSN": "postgresql://app:s3cret@db:5432/app",
        }
    )
    assert settings.pooler and settings.listen_dsn == "postgresql://app:s3cret@db:5432/app"
    assert "s3cret" not in repr(settings)
    with pytest.raises(pgworker.ConfigError, match="PGWORKER_POOLER='maybe' must be true or"):
        pgworker.Settings.from_env({"PGWORKER_DSN": "postgresql://x/y", "PGWORKER_POOLER": "maybe"})
    with pytest.raises(pgworker.ConfigError, match="listen_dsn: must be a PostgreSQL"):
        pgworker.Settings(dsn="postgresql://x/y", listen_dsn="")
