"""The tests' databases are reset between tests (tests/dbpool.py): what one test leaves, the
next cannot see, and what the reset cannot undo makes a new database rather than a stale one."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

import pgworker

from .dbpool import FINGERPRINT, DatabasePool, with_database

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _fingerprint(server_dsn: str, name: str) -> str:
    conn = await asyncpg.connect(with_database(server_dsn, name))
    try:
        return await conn.fetchval(FINGERPRINT)
    finally:
        await conn.close()


async def _dirty(dsn: str) -> asyncpg.Connection:
    """What tests leave behind: jobs, used sequences, a pooled function, tables, functions and
    triggers of their own, a schema, privileges granted then revoked, database settings (read-only
    sessions among them), planner statistics, and a session left open."""
    conn = await asyncpg.connect(dsn)
    for n in range(50):
        await pgworker.enqueue(conn, "t", {"n": n})
    await conn.execute(
        """
        UPDATE pgworker.jobs SET status = 'running';
        INSERT INTO pgworker.queues (name, paused_at) VALUES ('q', now());
        CREATE FUNCTION pgworker._pooled_job_claim_0123456789ab() RETURNS int
            LANGUAGE sql AS 'SELECT 1';
        CREATE TABLE effects (n int PRIMARY KEY);
        CREATE INDEX ON pgworker.jobs (priority);
        CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN RETURN NULL; END $$;
        CREATE TRIGGER refuse BEFORE UPDATE ON pgworker.workers
            FOR EACH ROW EXECUTE FUNCTION public.refuse();
        CREATE FUNCTION pgworker.test_slow() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN RETURN NULL; END $$;
        CREATE CONSTRAINT TRIGGER test_slow AFTER INSERT ON pgworker.job_events
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pgworker.test_slow();
        CREATE SCHEMA elsewhere;
        CREATE TABLE elsewhere.t (n int);
        CREATE TYPE mood AS ENUM ('calm');
        ANALYZE pgworker.jobs;
        """
    )
    role = f"pool_{uuid.uuid4().hex[:8]}"
    await conn.execute(
        f"CREATE ROLE {role}; GRANT USAGE ON SCHEMA pgworker TO {role}; "
        f"GRANT SELECT ON ALL TABLES IN SCHEMA pgworker TO {role}; "
        f"DROP OWNED BY {role}; DROP ROLE {role}"
    )
    database = await conn.fetchval("SELECT current_database()")
    await conn.execute(f"ALTER DATABASE \"{database}\" SET track_functions = 'pl'")
    await conn.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    return conn


async def test_a_reset_database_is_like_a_new_one(server_dsn: str, template_db: str) -> None:
    pool = DatabasePool(server_dsn, template_db)
    try:
        name = await pool.acquire()
        new = await _fingerprint(server_dsn, name)
        left_open = await _dirty(with_database(server_dsn, name))
        assert await _fingerprint(server_dsn, name) != new
        assert await pool.release(name) is None, "the reset fell back to a new database"
        assert left_open.is_closed() or not await _answers(left_open)
        again = await pool.acquire()
        assert again != name, "put back under its old name, which a leftover could reconnect to"
        assert await _fingerprint(server_dsn, again) == new
        conn = await asyncpg.connect(with_database(server_dsn, again))
        try:
            assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 0
            assert await conn.fetchval("SELECT count(*) FROM pgworker.queues") == 0
            job = await pgworker.enqueue(conn, "t", {})
            assert job.job.id == 1, "the job ids did not start again"
            assert await conn.fetchval("SHOW track_functions") == "none"
            assert (
                await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                == 0
            )
        finally:
            await conn.close()
    finally:
        await pool.close()


@pytest.mark.parametrize("jobs", [3, 3000])
async def test_rows_alone_are_undone_without_a_catalog_comparison(
    server_dsn: str, template_db: str, jobs: int
) -> None:
    """A test that wrote rows (a few pages: deleted; more: truncated) and analyzed a table, and
    changed no catalog: its database is like new, and no leftover can reach it by its old name."""
    pool = DatabasePool(server_dsn, template_db)
    try:
        name = await pool.acquire()
        new = await _fingerprint(server_dsn, name)
        conn = await asyncpg.connect(with_database(server_dsn, name))
        await pgworker.enqueue_many(conn, [pgworker.JobSpec("t", {"n": n}) for n in range(jobs)])
        await conn.execute("ANALYZE pgworker.queues")
        await conn.close()
        assert await _fingerprint(server_dsn, name) != new
        assert await pool.release(name) is None
        again = await pool.acquire()
        assert await _fingerprint(server_dsn, again) == new
        conn = await asyncpg.connect(with_database(server_dsn, again))
        try:
            assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 0
            assert (await pgworker.enqueue(conn, "t", {})).job.id == 1
        finally:
            await conn.close()
        with pytest.raises(asyncpg.InvalidCatalogNameError):
            await asyncpg.connect(with_database(server_dsn, name))
    finally:
        await pool.close()


async def _answers(conn: asyncpg.Connection) -> bool:
    try:
        await conn.fetchval("SELECT 1")
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        return False
    return True


async def test_what_a_reset_cannot_undo_makes_a_new_database(
    server_dsn: str, template_db: str
) -> None:
    pool = DatabasePool(server_dsn, template_db)
    try:
        name = await pool.acquire()
        new = await _fingerprint(server_dsn, name)
        conn = await asyncpg.connect(with_database(server_dsn, name))
        await conn.execute("ALTER TABLE pgworker.jobs ADD COLUMN extra int")
        await conn.close()
        why = await pool.release(name)
        assert why is not None and "differ" in why
        other = await pool.acquire()
        assert other != name
        assert await _fingerprint(server_dsn, other) == new
        admin = await asyncpg.connect(server_dsn)
        try:
            assert not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        finally:
            await admin.close()
    finally:
        await pool.close()


async def test_a_dropped_database_is_made_again(server_dsn: str, template_db: str) -> None:
    pool = DatabasePool(server_dsn, template_db)
    try:
        name = await pool.acquire()
        await pool.drop(name)
        assert await pool.release(name) is not None
        other = await pool.acquire()
        conn = await asyncpg.connect(with_database(server_dsn, other))
        try:
            assert await conn.fetchval("SELECT count(*) FROM pgworker.migrations") > 0
        finally:
            await conn.close()
    finally:
        await pool.close()


@pytest.mark.fresh_db
async def test_a_fresh_db_test_has_a_database_of_its_own(dsn: str, conn) -> None:
    assert "_fresh_" in await conn.fetchval("SELECT current_database()")
    await conn.execute("ALTER TABLE pgworker.jobs ADD COLUMN extra int")
