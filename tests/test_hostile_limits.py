"""Hostile tests of the cluster-wide limits (issue 23, items 2-4), against the real PostgreSQL:
a hostile operator (limits set by SQL mid-claim, rows edited by hand) and a hostile database
(rate windows and key cursors holding what no claim writes). Each claim here is the worker's
own pair of statements, limits_lock.sql then job_claim_limited.sql, in one transaction."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

import pgworker
from pgworker import JobSpec
from pgworker._db.queries import queries

pytestmark = pytest.mark.asyncio(loop_scope="session")

Q = queries("pgworker")
RUNNING = "SELECT count(*) FROM pgworker.jobs WHERE status = 'running' AND {}"


async def claim(
    conn: Any,
    type_: str,
    *,
    queue: str = "default",
    limit: int = 10,
    max_running: int | None = None,
    per_key: int | None = None,
    rate: tuple[int, int] | None = None,
    queue_limited: bool | None = None,
) -> list[Any]:
    """One limited claim of `type_` as a worker makes it, in a transaction of its own."""
    async with conn.transaction():
        rows = await Q.limits_lock(conn, [queue], [type_])
        return await limited(
            conn,
            type_,
            queue=queue,
            limit=limit,
            max_running=max_running,
            per_key=per_key,
            rate=rate,
            queue_limited=any(r["name"] == queue for r in rows)
            if queue_limited is None
            else queue_limited,
        )


async def limited(
    conn: Any,
    type_: str,
    *,
    queue: str = "default",
    limit: int = 10,
    max_running: int | None = None,
    per_key: int | None = None,
    rate: tuple[int, int] | None = None,
    queue_limited: bool = False,
) -> list[Any]:
    return await Q.job_claim_limited(
        conn,
        queue=queue,
        type=type_,
        version=1,
        limit=limit,
        worker_id="hostile",
        lease=30.0,
        max_retries=3,
        code_version=None,
        durable=True,
        max_running=max_running,
        max_running_per_key=per_key,
        rate=rate,
        queue_locked=queue_limited,
    )


async def test_a_queue_limit_set_between_the_lock_and_the_claim_is_not_exceeded(dsn, conn):
    """Two workers claim two limited tasks of queue q, each under its own task's lock; the
    operator sets q's max_running to 1 after both took their locks (q had no limit then, so no
    lock of q). Both claims then read q's limit, neither holding q's lock."""
    await pgworker.enqueue_many(conn, [JobSpec(t, queue="q") for t in ("a", "b") for _ in range(3)])
    other = await asyncpg.connect(dsn)
    try:
        tx1, tx2 = conn.transaction(), other.transaction()
        await tx1.start()
        await tx2.start()
        assert await Q.limits_lock(conn, ["q"], ["a"]) == []
        assert await Q.limits_lock(other, ["q"], ["b"]) == []
        admin = await asyncpg.connect(dsn)
        await admin.execute("INSERT INTO pgworker.queues (name, max_running) VALUES ('q', 1)")
        await admin.close()
        # limits_lock found q without limits: not locked.
        first = await limited(conn, "a", queue="q", max_running=100, queue_limited=False)
        second = await limited(other, "b", queue="q", max_running=100, queue_limited=False)
        await tx1.commit()
        await tx2.commit()
    finally:
        await other.close()
    assert len(first) + len(second) <= 1
    assert await conn.fetchval(RUNNING.format("queue = 'q'")) <= 1
