"""Rescue: a job whose worker is gone is rescued whatever its row holds (a lease without a claim
time, an attempt counter reset by hand), and a rescue that the database refuses for some jobs
(a trigger, more refused jobs than a page) still rescues the others."""

from __future__ import annotations

from typing import Any

import pytest

import pgworker
from pgworker._maintenance import rescue as _rescue
from pgworker._maintenance.maintenance import Maintenance

from .helpers import has_status

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


# --- schemas ---------------------------------------------------------------------------------
