"""The maintenance takes turns with the outcome writes on the worker's shared connection: a
backlog of retention or rescue is worked through in small statements, the connection
given back between two, so that outcome writes never wait long behind it."""

from __future__ import annotations

from typing import Any

import pytest

import pgworker
from pgworker._db.connection import SharedConnection
from pgworker._db.queries import Queries
from pgworker._maintenance import rescue as _rescue
from pgworker._maintenance.maintenance import Maintenance

from .helpers import serving_guarded, wait_for
from .test_rescue import lost_jobs
from .test_retention import finished, remaining
from .turns import timed_turns

pytestmark = pytest.mark.asyncio(loop_scope="session")

BOUND = 1.0
"""Generous: a turn of the maintenance took 5 to 30 ms here; one statement deleting the 100,000
jobs below, with their records, held the connection for seconds."""


async def test_outcome_writes_wait_little_while_the_leader_prunes_100000_jobs(dsn, pool):
    """A worker completes jobs while its maintenance deletes 100,000 finished jobs past their
    retention (each with an attempt, a step, a milestone and an event): no statement of the
    maintenance holds the shared connection for as long as BOUND, no outcome write waits that
    long for it, and the backlog takes hundreds of statements, not a few large ones."""
    old = await finished(pool, 100_000, "completed", days_ago=2, records=True)
    registry = pgworker.Registry()

    @registry.task("plain")
    async def plain(ctx: pgworker.JobContext, payload: Any) -> None:
        return None

    await pgworker.enqueue_many(pool, [pgworker.JobSpec("plain", {}) for _ in range(2000)])
    with timed_turns() as turns:
        async with serving_guarded(
            registry, dsn, lease=2.0, retain_completed=86400, concurrency=10
        ):
            await wait_for(lambda: _none_left(pool, old), timeout=55)
    maintenance = [t for t in turns if t.borrower.startswith("maintenance.")]
    outcomes = [t for t in turns if t.borrower == "completer"]
    assert outcomes, turns
    longest = max(maintenance, key=lambda t: t.held)
    assert longest.held < BOUND, longest
    assert max(t.waited for t in outcomes) < BOUND
    statements = sum(1 for t in maintenance if t.borrower == "maintenance.retention")
    assert statements >= len(old) / 250, statements


async def _none_left(pool: Any, ids: list[int]) -> bool:
    return await remaining(pool, ids) == 0


async def test_a_rescue_of_many_expired_jobs_writes_them_a_page_at_a_time(
    dsn, conn, pool, monkeypatch
):
    """1,000 expired jobs of a dead worker are rescued in one tick, in statements of at most 250
    jobs each, on the shared connection given back between two."""
    sizes: list[int] = []
    real = Queries.jobs_rescue

    async def counted(self: Queries, c: Any, worker_id: str, decided: Any) -> Any:
        sizes.append(len(decided))
        return await real(self, c, worker_id, decided)

    monkeypatch.setattr(Queries, "jobs_rescue", counted)
    lost = await lost_jobs(conn, 1000)
    shared = SharedConnection(pool)
    leader = Maintenance(shared, pgworker.Settings(dsn, lease=30, worker_id="leader"))
    try:
        with timed_turns() as turns:
            await leader.tick()
    finally:
        await shared.drop()
    assert await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs WHERE id = ANY($1) AND status = 'pending'", lost
    ) == len(lost)
    assert sizes == [250] * 4 and _rescue.PAGE == 250
    assert sum(1 for t in turns if t.borrower.startswith("maintenance.")) >= 2 * len(sizes)
