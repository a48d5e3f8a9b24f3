"""Pooler mode's settings as a careless or hostile user gives them, through a real PgBouncer in
transaction mode (tests/pgbouncer.py): the values PGWORKER_POOLER takes, a --listen-dsn that is
the pooler itself, unreachable, garbage or holds secrets and control bytes, the settings of
explicit transactions, the commands with pooler mode from the environment, and a service that
forgot `statement_cache_size=0`."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import anyio
import asyncpg
import pytest

import pgworker
from pgworker._db.connection import create_pool
from pgworker._db.queries import transaction
from pgworker.cli._common import _pooler

from .apps.basic import registry
from .helpers import ROOT, cli, cli_process, serving_guarded, statuses, wait_for
from .pgbouncer import PgBouncer, available

pytestmark = [
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.skipif(
        not available(), reason="needs PgBouncer (/usr/sbin/pgbouncer; apt-get install pgbouncer)"
    ),
]


@pytest.fixture
def bouncer(server_dsn: str) -> Iterator[PgBouncer]:
    with PgBouncer(server_dsn, pool_size=4) as b:
        yield b


@pytest.fixture
def narrow(server_dsn: str) -> Iterator[PgBouncer]:
    """One server session for every client: what one client leaves there, the next one meets."""
    with PgBouncer(server_dsn, pool_size=1) as b:
        yield b


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PGWORKER_", "DATABASE_URL"))}
    return {**e, "PYTHONPATH": str(ROOT), **extra}


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    """The error of a command that refused to run: exit status 2, one line, no traceback."""
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    return out.stderr


# --- PGWORKER_POOLER -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "on"),
    [
        ("", False),
        ("  ", False),
        ("yes", True),
        ("TRUE", True),
        ("True", True),
        ("1", True),
        ("on", True),
        (" true ", True),
        ("0", False),
        ("off", False),
        ("No", False),
    ],
)
async def test_pgworker_pooler_reads_the_same_in_run_and_in_every_command(
    raw: str, on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Empty is not set (the default), as for the other variables; spaces around are ignored,
    as for the numbers; `run` (Settings) and the other commands agree."""
    settings = pgworker.Settings.from_env(
        {"PGWORKER_DSN": "postgresql://x/y", "PGWORKER_POOLER": raw}
    )
    monkeypatch.setenv("PGWORKER_POOLER", raw)
    assert (settings.pooler, _pooler(argparse.Namespace(pooler=None))) == (on, on)
    assert _pooler(argparse.Namespace(pooler=True)) is True


@pytest.mark.parametrize("raw", ["maybe", "truee", "2", "y es"])
async def test_pgworker_pooler_refuses_anything_else_naming_it(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(pgworker.ConfigError, match=r"PGWORKER_POOLER=.* must be true or false"):
        pgworker.Settings.from_env({"PGWORKER_DSN": "postgresql://x/y", "PGWORKER_POOLER": raw})
    monkeypatch.setenv("PGWORKER_POOLER", raw)
    with pytest.raises(pgworker.ConfigError, match=r"PGWORKER_POOLER=.* must be true or false"):
        _pooler(argparse.Namespace(pooler=None))


async def test_blank_flags_from_the_environment_are_the_defaults() -> None:
    settings = pgworker.Settings.from_env(
        {"PGWORKER_DSN": "postgresql://x/y", "PGWORKER_LISTEN": "", "PGWORKER_DURABLE_CLAIMS": " "}
    )
    assert (settings.listen, settings.durable_claims) == (True, False)


async def test_every_command_in_pooler_mode_from_the_environment(empty_dsn, narrow):
    """PGWORKER_POOLER (as a careless user writes it) and PGWORKER_DSN, no option: through one
    server session, each command meets what the one before it left there."""
    given = {"PGWORKER_POOLER": " True ", "PGWORKER_DSN": narrow.dsn(empty_dsn)}

    def ok(*args: str) -> str:
        out = cli(*args, env=given)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out.stdout

    assert ok("migrate").startswith("applied migrations [")
    assert ok("migrate") == "schema is up to date\n"
    pending = ok("enqueue", "echo", "--delay", "3600")
    ok("enqueue", "echo")
    assert "pending" in ok("status")
    job = int(pending.split('"id": ')[1].split(",")[0])
    assert ok("cancel", str(job)) == f"job {job} cancelled (it was pending)\n"
    assert ok("failed", "list") == "(no failed jobs)\n"
    assert "cancelled" in ok("show", str(job))
    ok("replay", str(job), "--reason", "from the environment")
    assert "0" in ok("prune", "--older-than", "1d", "--dry-run")
    conn = await asyncpg.connect(empty_dsn)
    try:
        assert await statuses(conn) == {"pending": 2}
        held = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        assert held == 0
    finally:
        await conn.close()


# --- --listen-dsn ------------------------------------------------------------------------------


async def live_workers(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM pgworker.workers"))
    finally:
        await conn.close()


async def test_a_listen_dsn_through_the_pooler_is_refused_in_one_line(dsn, bouncer):
    """LISTEN through PgBouncer in transaction mode is accepted and never hears a notification:
    the worker refuses it at start-up, naming --listen-dsn, and leaves no worker behind that
    `status` would count as live."""
    through = bouncer.dsn(dsn)
    out = cli_process(
        "run", "tests.apps.basic", "--pooler", "--dsn", through, "--listen-dsn", through
    )
    error = one_line(out)
    assert "--listen-dsn" in error and "through a pooler" in error, error
    # From the environment, and for a direct worker that listens elsewhere: the same.
    out = cli_process("run", "tests.apps.basic", "--dsn", dsn, env={"PGWORKER_LISTEN_DSN": through})
    assert "--listen-dsn" in one_line(out)
    assert await live_workers(dsn) == 0
    with pytest.raises(pgworker.ConfigError, match=r"listen_dsn: .*through a pooler"):
        async with pgworker.Worker(registry, through, pooler=True, listen_dsn=through):
            pass
    assert await live_workers(dsn) == 0


async def test_a_listen_dsn_to_another_database_is_refused_in_one_line(dsn, server_dsn, bouncer):
    """NOTIFY reaches only the sessions of its own database: LISTEN on another one (an admin
    DSN pasted by mistake) would hear nothing, silently."""
    out = cli_process(
        "run", "tests.apps.basic", "--pooler", "--dsn", bouncer.dsn(dsn), "--listen-dsn", server_dsn
    )
    error = one_line(out)
    assert "--listen-dsn" in error and "reaches database 'postgres'" in error, error
    assert await live_workers(dsn) == 0


SECRET = "s3?cr\x1b[2Jet"
"""A password holding a character that ends a URL's password (?) and a terminal escape."""


@pytest.mark.parametrize(
    ("listen_dsn", "said"),
    [
        ("postgresql://postgres@127.0.0.1:1/postgres", "cannot reach the database"),
        ("garbage://::", "cannot reach the database"),
        ("host=127.0.0.1 port=1", "cannot reach the database"),
        ("postgresql://no_such_role@127.0.0.1:5432/postgres", "refused the login"),
        (f"postgresql://bob:{SECRET}@127.0.0.1:1/postgres", "percent-encode"),
        (f"postgresql://bob:{SECRET}@127.0.0.1:1/pg\nwp\r", "percent-encode"),
        ("postgresql://bob:s3cret@127.0.0.1:1/\x1b]0;pwned\x07", "cannot reach the database"),
    ],
)
async def test_a_bad_listen_dsn_is_one_line_naming_it(dsn, bouncer, listen_dsn, said):
    """Never a traceback, never the password (nor a piece of it), never a raw control byte;
    the exit status of the other configuration errors."""
    out = cli_process(
        "run", "tests.apps.basic", "--pooler", "--dsn", bouncer.dsn(dsn), "--listen-dsn", listen_dsn
    )
    error = one_line(out)
    assert "--listen-dsn" in error and said in error, error
    assert "--dsn," not in error, error  # the option at fault, not the other one
    assert not any(piece in error for piece in ("s3", "cr", "et@", "cret")), error
    assert not any(ord(c) < 32 and c != "\n" for c in error), repr(error)
    assert await live_workers(dsn) == 0


async def test_a_listen_dsn_without_pooler_is_where_a_direct_worker_listens(dsn, conn):
    """Accepted, as documented: a direct worker listens there rather than on its DSN."""
    async with serving_guarded(registry, dsn, listen_dsn=dsn) as worker:
        assert "notifier" in worker.health()
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            f"pgworker-listen:{worker.worker_id}",
        )


async def test_no_listen_wins_over_a_listen_dsn(dsn, bouncer, conn):
    """--no-listen (PGWORKER_LISTEN=false) leaves the listen DSN unused, not even checked."""
    job = (await pgworker.enqueue(conn, "echo", {})).job.id
    unreachable = "postgresql://postgres@127.0.0.1:1/postgres"
    async with serving_guarded(
        registry, bouncer.dsn(dsn), pooler=True, listen=False, listen_dsn=unreachable
    ) as worker:
        assert "notifier" not in worker.health()
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'completed' FROM pgworker.jobs WHERE id = $1", job
            ),
            timeout=20,
        )


# --- transactions ------------------------------------------------------------------------------


async def test_explicit_transactions_get_the_pooler_settings(dsn, conn, narrow):
    """A transaction opened with asyncpg's transaction() (as every multi-statement write of
    pgworker is) gets lock_timeout too: a row someone holds locked makes it give up, not hang."""
    pool = await create_pool(narrow.dsn(dsn), size=2, lock_timeout=1.5, pooler=True)
    job = (await pgworker.enqueue(conn, "echo", {})).job.id
    try:
        async with pool.acquire() as c, c.transaction(isolation="repeatable_read"):
            assert await c.fetchval("SELECT current_setting('lock_timeout')") == "1500ms"
            assert await c.fetchval("SELECT current_setting('enable_bitmapscan')") == "off"
            assert await c.fetchval("SELECT current_setting('transaction_isolation')") == (
                "repeatable read"
            )
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM pgworker.jobs WHERE id = $1 FOR UPDATE", job)
            with anyio.fail_after(10):
                with pytest.raises(asyncpg.exceptions.LockNotAvailableError):
                    async with transaction(pool) as c:
                        await c.execute("UPDATE pgworker.jobs SET priority = 1 WHERE id = $1", job)
    finally:
        await pool.close()
    other = await asyncpg.connect(narrow.dsn(dsn), statement_cache_size=0)
    try:  # the same server session, another client: nothing was left on it
        assert await other.fetchval("SELECT current_setting('lock_timeout')") == "0"
    finally:
        await other.close()


# --- services that enqueue -----------------------------------------------------------------------


FORGETFUL_CLIENT = textwrap.dedent(
    """
    import asyncio, sys
    import pgworker

    async def main():
        if sys.argv[2] == "asyncpg":
            import asyncpg
            conn = await asyncpg.connect(sys.argv[1])  # statement_cache_size forgotten
        else:
            import psycopg
            conn = await psycopg.AsyncConnection.connect(sys.argv[1], autocommit=True)
        try:
            for n in range(8):  # psycopg prepares a statement run 5 times
                await pgworker.enqueue(conn, "echo", {"n": n})
        except pgworker.PgWorkerError as exc:
            print(f"{type(exc).__name__}: {exc}")
            sys.exit(3)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize(
    ("driver", "fix"),
    [("asyncpg", "statement_cache_size=0"), ("psycopg", "prepare_threshold=None")],
)
async def test_a_service_that_forgot_the_statement_cache_is_told_the_fix(dsn, narrow, driver, fix):
    """The first client alone does not see it: it leaves its prepared statements on the one
    server session, and the next client meets them. That one gets a ConfigError naming the
    setting to change, not the driver's error."""
    if driver == "psycopg":
        pytest.importorskip("psycopg")
    outs = [
        subprocess.run(
            [sys.executable, "-c", FORGETFUL_CLIENT, narrow.dsn(dsn), driver],
            capture_output=True,
            text=True,
            env=env(),
            cwd=ROOT,
            timeout=60,
        )
        for _ in range(2)
    ]
    assert outs[0].returncode == 0, outs[0].stderr
    assert outs[1].returncode == 3, (outs[1].stdout, outs[1].stderr)
    said = outs[1].stdout
    assert said.startswith("ConfigError: conn: ") and fix in said and "pooler" in said, said
    assert len(said.strip().splitlines()) == 1, said


# --- transactional steps ---------------------------------------------------------------------

steps = pgworker.Registry()


@steps.task("step", max_retries=0)
async def step_with(ctx: pgworker.JobContext, payload: dict) -> object:
    async def reads(conn: asyncpg.Connection) -> object:
        if payload["how"] == "cursor":
            return [r[0] async for r in conn.cursor("SELECT 1")]
        if payload["how"] == "prepare":
            return await (await conn.prepare("SELECT 1")).fetchval()
        if payload["how"] == "records":
            await conn.execute("CREATE TEMP TABLE t (n int) ON COMMIT DROP")
            return await conn.copy_records_to_table("t", records=[(1,)])
        return await conn.fetchval("SELECT 1")

    return await ctx.transactional_step("read", reads)


async def test_a_transactional_step_in_pooler_mode_refuses_named_statements(dsn, conn, narrow):
    """conn.prepare(), conn.cursor() and copy_records_to_table() prepare a statement by name,
    which would stay on the server session after the step: in pooler mode the step refuses
    them, saying what to use instead; its unnamed statements run."""
    hows = ["cursor", "prepare", "records", "fetch"]
    jobs = {h: (await pgworker.enqueue(conn, "step", {"how": h})).job.id for h in hows}
    async with serving_guarded(steps, narrow.dsn(dsn), pooler=True):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 4 FROM pgworker.jobs WHERE status IN ('completed', 'failed')"
            ),
            timeout=30,
        )
    rows = await conn.fetch(
        "SELECT j.id, j.status, a.error_message FROM pgworker.jobs j "
        "JOIN pgworker.job_attempts a ON a.job_id = j.id"
    )
    found = {r["id"]: (r["status"], r["error_message"] or "") for r in rows}
    assert found[jobs["fetch"]] == ("completed", "")
    for how, method in [
        ("cursor", "cursor"),
        ("prepare", "prepare"),
        ("records", "copy_records_to_table"),
    ]:
        status, error = found[jobs[how]]
        assert status == "failed", (how, error)
        assert f"conn.{method}(), which prepares a named statement" in error, error
        assert "conn.fetch()" in error, error
    other = await asyncpg.connect(narrow.dsn(dsn), statement_cache_size=0)
    try:  # the one server session every client had: no statement left there
        assert await other.fetchval("SELECT count(*) FROM pg_prepared_statements") == 0
    finally:
        await other.close()


async def test_a_pooler_worker_leaves_nothing_on_the_server_session(dsn, conn, narrow):
    """Through one server session for every client, after a pooler worker ran jobs (claims,
    outcomes, heartbeats, maintenance, a transactional step): no named statement, no portal,
    no LISTEN, no advisory lock, no setting left for the next client."""
    for how in ("fetch", "fetch"):
        await pgworker.enqueue(conn, "step", {"how": how})
    async with serving_guarded(steps, narrow.dsn(dsn), pooler=True, lease=1.5):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 2 FROM pgworker.jobs WHERE status = 'completed'"
            ),
            timeout=30,
        )
    other = await asyncpg.connect(narrow.dsn(dsn), statement_cache_size=0)
    try:
        left = await other.fetchrow(
            "SELECT (SELECT count(*) FROM pg_prepared_statements) AS statements, "
            "(SELECT count(*) FROM pg_cursors WHERE name <> '') AS cursors, "
            "(SELECT count(*) FROM pg_listening_channels()) AS channels, "
            "(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            " AND pid = pg_backend_pid()) AS locks, "
            "current_setting('lock_timeout') AS lock_timeout, "
            "current_setting('enable_bitmapscan') AS bitmapscan, "
            "current_setting('synchronous_commit') AS synchronous_commit"
        )
        assert dict(left) == {
            "statements": 0,
            "cursors": 0,
            "channels": 0,
            "locks": 0,
            "lock_timeout": "0",
            "bitmapscan": "on",
            "synchronous_commit": "on",
        }
    finally:
        await other.close()
