"""Server connections per worker (docs/scaling.md, "Connections"): at most 3 in direct
mode whatever the concurrency (claims; outcomes, heartbeat, maintenance and the steps' records
taking turns on one; LISTEN), plus one per transactional step for its transaction only, closed
once idle for IDLE_LIFETIME. Sampled from pg_stat_activity while real worker processes run at
full load, and once they are idle."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

import pgworker
from pgworker._steps.store import IDLE_LIFETIME

from .connections import Sample, sample
from .helpers import all_finished, spawn_worker, wait_for

WORKERS = 4
CONCURRENCY = 50
PER_WORKER = 3
"""The documented formula with no transactional step open: claims, shared, LISTEN."""
pytestmark = pytest.mark.asyncio(loop_scope="session")

JOBS = 400
HOLD = 0.4
TX_HOLD = 0.05
"""Transactional steps short beside the handler, as they usually are, and the handlers' holds
spread (0 to 1.75 HOLD): 200 transactional steps at once would need 200 connections, more than
the server's max_connections (100 by default), which other tests share."""


async def running(conn: Any) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE status = 'running'"))


async def sampled_until_done(conn: Any) -> tuple[list[Sample], int]:
    """Samples every 20 ms until every job finished, and the most jobs seen running at once."""
    samples: list[Sample] = []
    busiest = 0
    with anyio.fail_after(120):
        while not await all_finished(conn):
            samples.append(await sample(conn))
            busiest = max(busiest, await running(conn))
            await anyio.sleep(0.02)
    return samples, busiest


async def idle_samples(conn: Any, seconds: float) -> list[Sample]:
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(await sample(conn))
        await anyio.sleep(0.05)
    return samples


def over(samples: list[Sample], limit: int, workers: list[str]) -> list[tuple[str, int]]:
    return [(w, s.total(w)) for s in samples for w in workers if s.total(w) > limit]


async def test_workers_hold_at_most_three_connections_whatever_concurrency_and_steps(
    dsn, conn, tmp_path
):
    ids = [f"conns-{i}" for i in range(WORKERS)]
    procs = [
        spawn_worker(
            "tests.apps.conns",
            dsn,
            tmp_path / f"{w}.log",
            "--concurrency",
            str(CONCURRENCY),
            "--worker-id",
            w,
        )
        for w in ids
    ]
    try:

        async def all_serve() -> bool:
            s = await sample(conn)
            return all(s.main[w] == PER_WORKER for w in ids)

        await wait_for(all_serve, timeout=60)
        assert not over(await idle_samples(conn, 0.5), PER_WORKER, ids)

        # Plain steps and milestones: no connection of their own, whatever the load.
        plain = [pgworker.JobSpec("plain", {"hold": HOLD}) for _ in range(JOBS)]
        await pgworker.enqueue_many(conn, plain)
        samples, busiest = await sampled_until_done(conn)
        assert busiest >= WORKERS * CONCURRENCY * 3 // 4, "the workers never ran at full load"
        assert not over(samples, PER_WORKER, ids)
        assert not any(s.steps_in_transaction or s.steps_idle for s in samples)

        # Transactional steps: a connection each for their transaction, given back after.
        tx = [
            pgworker.JobSpec("tx", {"hold": HOLD * (i % 8) / 4, "tx_hold": TX_HOLD})
            for i in range(JOBS)
        ]
        await pgworker.enqueue_many(conn, tx)
        samples, busiest = await sampled_until_done(conn)
        assert busiest >= WORKERS * CONCURRENCY * 3 // 4, "the workers never ran at full load"
        assert not [(w, s.main[w]) for s in samples for w in ids if s.main[w] > PER_WORKER]
        assert max(s.steps_in_transaction[w] for s in samples for w in ids) > 1
        assert all(s.steps_in_transaction[w] <= CONCURRENCY for s in samples for w in ids)

        async def given_back() -> bool:
            s = await sample(conn)
            return not over([s], PER_WORKER, ids)

        await wait_for(given_back, timeout=IDLE_LIFETIME + 5)
        assert not over(await idle_samples(conn, 1.0), PER_WORKER, ids)
        # Every job completed at its first attempt: no connection was refused on the way.
        again = await conn.fetch(
            "SELECT id, type, status, attempts, error FROM pgworker.jobs "
            "WHERE status <> 'completed' OR attempts <> 1"
        )
        assert not again, [
            (r["outcome"], r["error_type"], r["error_message"])
            for r in await conn.fetch(
                "SELECT * FROM pgworker.job_attempts WHERE job_id = $1", again[0]["id"]
            )
        ]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
