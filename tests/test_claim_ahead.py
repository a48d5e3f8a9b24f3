"""Claims ahead of the free slots: a worker whose handlers end faster than a claim takes claims
more jobs than it has free slots, so that the next claim runs while the slots work; a type that
has not shown itself that quick is never claimed beyond the free slots; and the jobs claimed
ahead go back at once when the worker stops. A claim's jobs share their attempts'
started_at (the claim statement's time)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import pgworker
from pgworker import JobSpec
from pgworker._runtime.claimer import AHEAD_MOST

from .helpers import all_finished, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

CONCURRENCY = 2


async def largest_claims(conn: Any) -> dict[str, int]:
    """The most jobs of each type one claim statement took."""
    rows = await conn.fetch(
        "SELECT type, max(n) AS most FROM (SELECT type, count(*) AS n FROM pgworker.job_attempts "
        "GROUP BY type, worker_id, started_at) AS c GROUP BY type"
    )
    return {r["type"]: r["most"] for r in rows}


def registry_of(release: anyio.Event, blocked: list[int]) -> pgworker.Registry:
    registry = pgworker.Registry()

    @registry.task("quick")
    async def quick(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        return None

    @registry.task("slow")
    async def slow(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        await anyio.sleep(0.2)

    @registry.task("block")
    async def block(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        blocked.append(ctx.job_id)
        await release.wait()

    return registry


async def warm_up(conn: Any) -> None:
    await pgworker.enqueue_many(conn, [JobSpec("quick", {"n": n}) for n in range(300)])
    await wait_for(lambda: all_finished(conn), timeout=30)


async def test_quick_jobs_are_claimed_ahead_and_a_slow_type_is_not(dsn, conn):
    registry = registry_of(anyio.Event(), [])
    # A long poll: a claim that waits for it after the slow jobs end would fail the bound below.
    async with pgworker.Worker(registry, dsn, concurrency=CONCURRENCY, poll_interval=60):
        await warm_up(conn)
        await pgworker.enqueue_many(conn, [JobSpec("slow", {"n": n}) for n in range(6)])
        await wait_for(lambda: all_finished(conn), timeout=10)
    most = await largest_claims(conn)
    assert CONCURRENCY < most["quick"] <= CONCURRENCY * (1 + AHEAD_MOST), most
    assert most["slow"] <= CONCURRENCY, most
    once = await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs j WHERE j.status = 'completed' AND "
        "(SELECT count(*) FROM pgworker.job_attempts a WHERE a.job_id = j.id) = 1"
    )
    assert once == 306


async def test_jobs_claimed_ahead_go_back_at_once_when_the_worker_stops(dsn, conn):
    release = anyio.Event()
    blocked: list[int] = []
    worker = pgworker.Worker(registry_of(release, blocked), dsn, concurrency=CONCURRENCY)
    async with worker:
        await warm_up(conn)
        # One statement, one claim: the two blocking jobs take both slots, the quick ones wait.
        result = await pgworker.enqueue_many(
            conn,
            [JobSpec("block", {}, priority=10) for _ in range(2)]
            + [JobSpec("quick", {"late": n}) for n in range(6)],
        )
        ids = [r.job.id for r in result]
        await wait_for(lambda: len(blocked) == 2)
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE id = ANY($1::bigint[]) AND type = 'quick' "
            "AND status = 'running'",
            ids,
        )
        # As many as the quick type's average allows (all six on a quiet machine).
        assert waiting >= 1, "the quick jobs were not claimed ahead"
        worker.stop()

        async def handed_back() -> bool:
            n = await conn.fetchval(
                "SELECT count(*) FROM pgworker.jobs j JOIN pgworker.job_attempts a "
                "ON a.job_id = j.id WHERE j.id = ANY($1::bigint[]) AND j.type = 'quick' "
                "AND j.status = 'pending' AND a.outcome = 'interrupted'",
                ids,
            )
            return n == waiting

        await wait_for(handed_back)
        release.set()
    rows = await conn.fetch(
        "SELECT status, count(*) AS n FROM pgworker.jobs WHERE id = ANY($1::bigint[]) "
        "GROUP BY status",
        ids,
    )
    assert {r["status"]: r["n"] for r in rows} == {"completed": 2, "pending": 6}
