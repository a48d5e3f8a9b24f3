"""Hostile tests of issue 24 (unique jobs, update_job, wait, dependencies, event waits, plain
`def` handlers), against the real PostgreSQL: inputs and interleavings a hostile user reaches."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import asyncpg
import pytest

import pgworker

from .helpers import has_status, serving_guarded, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_chain_of_500_dependants_is_cancelled_with_its_root(conn) -> None:
    """Cancelling the root of a chain of 500 dependants cancels all of them: the cancel must not
    fail on PostgreSQL's stack depth (each dependant's cancel fires the trigger again)."""
    root = await pgworker.enqueue(conn, "root", {})
    last = root.job.id
    for _ in range(500):
        last = (await pgworker.enqueue(conn, "child", {}, after=[last])).job.id
    await pgworker.cancel(conn, root.job.id)
    assert await has_status(conn, last, "cancelled")


async def test_wait_with_timeout_zero_returns_a_job_already_ended(conn, dsn) -> None:
    """timeout=0 asks "has it ended?": a job that ended is returned, not a TimeoutError."""
    job = await pgworker.enqueue(conn, "t", {})
    await pgworker.cancel(conn, job.job.id)
    ended = await pgworker.wait(dsn, job.job.id, timeout=0)
    assert ended.status == "cancelled"


async def test_a_row_lock_on_one_awaited_job_does_not_hold_every_wait(conn, dsn) -> None:
    """A transaction holding a lock on one awaited job (a caller's enqueue after= it, an
    update_job in a long transaction) must not stall the waits of other jobs of the process."""
    locked = await pgworker.enqueue(conn, "t", {})
    done = await pgworker.enqueue(conn, "t", {})
    await pgworker.cancel(conn, done.job.id)
    other = await asyncpg.connect(dsn)
    try:
        tx = other.transaction()
        await tx.start()
        await pgworker.enqueue(other, "child", {}, after=[locked.job.id])
        slow = asyncio.ensure_future(pgworker.wait(dsn, locked.job.id))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        ended = await pgworker.wait(dsn, done.job.id, timeout=5)
        assert ended.status == "cancelled"
        assert time.monotonic() - started < 3
        await tx.rollback()
        slow.cancel()
    finally:
        await other.close()


async def test_an_event_emitted_after_the_enqueue_reaches_the_wait(conn, dsn) -> None:
    """An emit whose statement runs after the job was enqueued, in a transaction begun before,
    is an event emitted after the enqueue: the wait recorded after its commit consumes it."""
    registry = pgworker.Registry()
    seen: list[object] = []

    @registry.task("approval")
    async def approval(ctx, payload):
        seen.append(await ctx.wait_for_event("approved", timeout=30))

    emitter = await asyncpg.connect(dsn)
    try:
        async with emitter.transaction():
            await emitter.execute("SELECT 1")  # the transaction's now() is taken here
            await asyncio.sleep(0.05)
            job = await pgworker.enqueue(conn, "approval", {})
            await asyncio.sleep(0.05)
            await pgworker.emit(emitter, "approved", {"ok": True})
        async with serving_guarded(registry, dsn):
            await wait_for(lambda: has_status(conn, job.job.id, "completed"), timeout=10)
    finally:
        await emitter.close()
    assert seen == [{"ok": True}]


async def test_enqueue_many_with_one_unique_key_twice_in_a_batch(conn) -> None:
    """Two specs of one batch with the same unique key: one job, both results name it (or a
    clear error naming the field), never a raw unique-violation."""
    specs = [pgworker.JobSpec("u", {"n": n}, unique_key="k") for n in range(2)]
    results = await pgworker.enqueue_many(conn, specs)
    assert results[0].job.id == results[1].job.id
    assert [r.created for r in results] == [True, False]


LAST_MICROSECOND = datetime.max.replace(tzinfo=UTC)
"""What asyncpg sends as PostgreSQL's 'infinity': the run_at of a parked job."""


async def test_the_last_microsecond_as_run_at_does_not_park_a_job_forever(conn) -> None:
    """run_at=datetime.max (UTC) would be stored as 'infinity', the run_at of a parked job that
    nothing releases (and update_job would then refuse to reschedule it): it is kept one
    microsecond earlier, a finite time, by enqueue and by update_job."""
    job = await pgworker.enqueue(conn, "t", {}, run_at=LAST_MICROSECOND)
    finite = "SELECT isfinite(run_at) FROM pgworker.jobs WHERE id = $1"
    assert await conn.fetchval(finite, job.job.id)
    other = await pgworker.enqueue(conn, "t", {})
    await pgworker.update_job(conn, other.job.id, run_at=LAST_MICROSECOND)
    assert await conn.fetchval(finite, other.job.id)
    # Still a time update_job changes: the job is not parked.
    await pgworker.update_job(conn, job.job.id, run_at=datetime(2030, 1, 1, tzinfo=UTC))


async def test_unique_states_from_a_generator_are_named_in_the_error(conn) -> None:
    """A generator of states is read once: the refusal must still show what was given."""
    with pytest.raises(pgworker.ValidationError) as caught:
        await pgworker.enqueue(
            conn, "u", {}, unique_key="k", unique_states=(s for s in ["pending"])
        )
    assert "'pending'" in str(caught.value)


async def test_an_endless_after_is_refused_not_read_forever(dsn, conn):
    import itertools

    with pytest.raises(pgworker.ValidationError, match="at most 1,000 parents") as caught:
        await pgworker.enqueue(conn, "x", {}, after=itertools.count(1))
    assert caught.value.field == "after"
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 0
