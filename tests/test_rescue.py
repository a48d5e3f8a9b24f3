"""Rescue: a job whose worker is gone is rescued whatever its row holds (a lease without a claim
time, an attempt counter reset by hand), and a rescue that the database refuses for some jobs
(a trigger, more refused jobs than a page) still rescues the others."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

import pgworker
from pgworker._db import files
from pgworker._maintenance import rescue as _rescue
from pgworker._maintenance.maintenance import Maintenance
from pgworker._runtime import notifier as _notifier
from pgworker.operations import status

from .helpers import has_status, serving_guarded, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

registry = pgworker.Registry()


@registry.task("plain")
async def plain(ctx: pgworker.JobContext, payload: Any) -> Any:
    return payload


async def lost_jobs(conn: Any, n: int, type_: str = "t", after_ms: int = 0) -> list[int]:
    """`n` jobs claimed by a worker that is gone, their leases expired an hour ago (plus
    `after_ms` and their rank in milliseconds: later ones expired later), each with its open
    attempt."""
    ids = await conn.fetchval(
        """WITH made AS (
               INSERT INTO pgworker.jobs (type, status, attempts, worker_id, max_retries,
                                          claimed_at, lease_expires_at)
               SELECT $1, 'running', 1, 'ghost', 3, clock_timestamp(),
                      now() - interval '1 hour' + ($3 + g) * interval '1 ms'
               FROM generate_series(1, $2) AS g
               RETURNING id, claimed_at, type, queue, worker_id, correlation_id
           ), opened AS (
               INSERT INTO pgworker.job_attempts
                   (job_id, attempt, type, queue, worker_id, correlation_id, started_at)
               SELECT id, 1, type, queue, worker_id, correlation_id, claimed_at FROM made
           )
           SELECT array_agg(id ORDER BY id) FROM made""",
        type_,
        n,
        after_ms,
    )
    return list(ids)


async def count(conn: Any, ids: list[int], status_: str) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs WHERE id = ANY($1::bigint[]) AND status = $2",
        ids,
        status_,
    )


def leader(pool: Any, dsn: str) -> Maintenance:
    return Maintenance(pool, pgworker.Settings(dsn, lease=30, worker_id="leader"), registry)


async def refuse_rescues_of(conn: Any, type_: str, errcode: str = "P0001") -> None:
    """A trigger of the user's own that refuses to let jobs of `type_` leave `running`."""
    await conn.execute(
        f"""CREATE FUNCTION public.refuse_rescue() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.type = '{type_}' AND NEW.status <> 'running' THEN
                    RAISE EXCEPTION 'not this one' USING ERRCODE = '{errcode}';
                END IF;
                RETURN NEW;
            END $$"""
    )
    await conn.execute(
        "CREATE TRIGGER refuse_rescue BEFORE UPDATE ON pgworker.jobs "
        "FOR EACH ROW EXECUTE FUNCTION public.refuse_rescue()"
    )


# --- the rescue of lost jobs ---------------------------------------------------------------------


async def test_rows_holding_a_lease_without_a_claim_time_neither_stay_stuck_nor_hide_others(
    dsn, conn, pool
):
    """A thousand running rows written by hand with a lease but no claimed_at used to be read by
    every tick and never rescued (the fence compared claimed_at with =): they stayed running for
    ever, and every lost job behind them too."""
    partial = await lost_jobs(conn, 1000)
    await conn.execute(
        "UPDATE pgworker.jobs SET claimed_at = NULL WHERE id = ANY($1::bigint[])", partial
    )
    behind = await lost_jobs(conn, 5, after_ms=100_000)
    m = leader(pool, dsn)
    for _ in range(3):
        await m.tick()
    assert await count(conn, partial + behind, "pending") == 1005


async def test_a_trigger_raising_any_error_on_one_rescue_does_not_stop_the_others(dsn, conn, pool):
    """A user's trigger that fails with something other than a plain refusal (here a privilege it
    lacks, as an audit insert would) used to fail every tick: no lost job was rescued again."""
    await refuse_rescues_of(conn, "audited", errcode="42501")
    refused = await lost_jobs(conn, 1, "audited")
    others = await lost_jobs(conn, 3, "t", after_ms=10)
    m = leader(pool, dsn)
    await m.tick()
    assert await count(conn, others, "pending") == 3
    assert await count(conn, refused, "running") == 1


async def test_more_than_a_page_of_refused_jobs_never_hides_the_others(
    dsn, conn, pool, monkeypatch
):
    """Two thousand jobs a trigger refuses, older than three good ones: the rescue read the 1000
    oldest it had not yet seen refused, remembered 1000 of them, and so went round the refused
    ones for ever. Now each tick reads on after a full page; and refused jobs are tried again
    once in a while (every REFUSED_RETRY seconds), since what refused them may have been fixed."""
    await refuse_rescues_of(conn, "refused")
    refused = await lost_jobs(conn, 2000, "refused")
    good = await lost_jobs(conn, 3, after_ms=100_000)
    m = leader(pool, dsn)
    for _ in range(10):  # a round takes at most four pages, fewer once half its interval is spent
        await m.tick()
        if await count(conn, good, "pending") == 3:
            break
    assert await count(conn, good, "pending") == 3
    assert await count(conn, refused, "running") == 2000
    await conn.execute("DROP TRIGGER refuse_rescue ON pgworker.jobs")
    monkeypatch.setattr(_rescue, "REFUSED_RETRY", 0.0)
    for _ in range(10):
        await m.tick()
        if await count(conn, refused, "pending") == 2000:
            break
    assert await count(conn, refused, "pending") == 2000


async def test_a_rescue_closes_the_open_attempt_of_a_job_whose_counter_was_reset(dsn, conn, pool):
    """An operator reset `attempts` of a running job; its worker then died. The rescue closed the
    attempt numbered by the counter (none), and left the real one `running` for ever."""
    [job_id] = await lost_jobs(conn, 1)
    await conn.execute("UPDATE pgworker.jobs SET attempts = 0 WHERE id = $1", job_id)
    await leader(pool, dsn).tick()
    assert await has_status(conn, job_id, "pending")
    outcomes = await conn.fetch(
        "SELECT outcome FROM pgworker.job_attempts WHERE job_id = $1", job_id
    )
    assert [r["outcome"] for r in outcomes] == ["lost"]


# --- operations with bad arguments -----------------------------------------------------------


@pytest.mark.parametrize("bad", [True, "1", 1.0, 2**63, 0, None])
async def test_a_job_id_that_is_not_a_bigint_is_a_validation_error_naming_it(conn, bad):
    """get_job and cancel passed the id to asyncpg as given: "1" or 2**63 raised asyncpg's
    DataError, 1.0 was rounded, and True read and cancelled job 1."""
    first = await pgworker.enqueue(conn, "t", {})
    assert first.job.id == 1
    for call in (pgworker.get_job, pgworker.cancel):
        with pytest.raises(pgworker.ValidationError, match="job_id") as info:
            await call(conn, bad)
        assert info.value.field == "job_id"
    assert await has_status(conn, first.job.id, "pending")


@pytest.mark.parametrize("bad", [float("nan"), "60", 1e300, -1, 0])
async def test_status_with_a_bad_live_within_is_a_validation_error_naming_it(conn, bad):
    with pytest.raises(pgworker.ValidationError, match="live_within"):
        await status(conn, live_within=bad)


async def test_migrate_through_a_pool(empty_dsn):
    """migrate(pool) took the migration lock on one pooled connection, then raised
    AttributeError (a pool has no transaction), the lock left behind."""
    async with asyncpg.create_pool(empty_dsn, min_size=1, max_size=3) as p:
        assert await pgworker.migrate(p) == [m.version for m in files.migrations("pgworker")]
        assert await pgworker.migrate(p) == []
        locks = await p.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        assert locks == 0


async def test_a_row_too_deep_to_decode_is_a_typed_error_naming_the_job_and_column(conn):
    """A payload or result nested past Python's recursion, written around enqueue: get_job
    raised a bare RecursionError. (A worker fails such a job; operators then read it.)"""
    depth = 5000
    job_id = await conn.fetchval(
        "INSERT INTO pgworker.jobs (type, payload) VALUES ('t', $1::jsonb) RETURNING id",
        "[" * depth + "]" * depth,
    )
    with pytest.raises(pgworker.PgWorkerError, match=rf"payload: .*job {job_id}.*SQL"):
        await pgworker.get_job(conn, job_id)
    await conn.execute(
        "UPDATE pgworker.jobs SET payload = '{}', result = $2::jsonb WHERE id = $1",
        job_id,
        '{"a":' * depth + "1" + "}" * depth,
    )
    with pytest.raises(pgworker.PgWorkerError, match=rf"result: .*job {job_id}"):
        await pgworker.get_job(conn, job_id)


# --- schemas ---------------------------------------------------------------------------------


async def test_a_schema_name_too_long_for_its_channels_is_refused_before_anything_is_written(
    dsn, conn
):
    """A schema name of 57 to 63 characters migrated, and then every enqueue raised asyncpg's
    "channel name too long" (its NOTIFY channels are named after it)."""
    for bad in ("s" * 57, "s" * 63):
        for call in (
            pgworker.migrate(conn, schema=bad),
            pgworker.enqueue(conn, "t", {}, schema=bad),
            pgworker.get_job(conn, 1, schema=bad),
        ):
            with pytest.raises(pgworker.ValidationError, match="schema") as info:
                await call
            assert "56" in str(info.value)
        with pytest.raises(pgworker.ConfigError, match="schema"):
            pgworker.Settings(dsn, schema=bad)
    assert not await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'sss%'")


async def test_the_longest_schema_name_serves_with_a_listener_that_hears_itself(
    dsn, conn, monkeypatch
):
    """At 56 characters every channel fits; the listener's ping channel, named after the schema,
    did not (from 46 characters): every health check failed and the listener reconnected for
    ever."""
    monkeypatch.setattr(_notifier, "CHECK_EVERY", 0.1)
    schema = "s" * 56
    await pgworker.migrate(conn, schema=schema)
    async with serving_guarded(registry, dsn, schema=schema, poll_interval=60) as worker:
        r = await pgworker.enqueue(conn, "plain", {"x": 1}, schema=schema)

        async def completed() -> bool:
            job = await pgworker.get_job(conn, r.job.id, schema=schema)
            return job is not None and job.status == "completed"

        await wait_for(completed)
        # The listener's health check (a ping to itself) went round, and no check failed.
        await wait_for(lambda: worker.health()["notifier"]["last_success"] is not None)
        assert worker.health()["notifier"]["last_error"] is None
