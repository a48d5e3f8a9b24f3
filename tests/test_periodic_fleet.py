"""Periodic jobs across a fleet: 3 real `pgworker run` processes
serve tests/apps/periodic.py, three one-second schedules of one task (catch_up "latest", "all"
and "none"). While they run, each slot is one job (no slot twice, none missed) enqueued about
when it falls; after the fleet was stopped for several slots, each policy catches up as it says.

Timing: the lease is 2 s (a handover within a few seconds); no assertion is tighter than 5 s,
but the median lag of a slot's job, which a leader that only woke at its maintenance tick would
break. The waits are bounded conditions on the database's clock and tables."""

from __future__ import annotations

import contextlib
import itertools
import signal
import statistics
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pgworker._maintenance.periodic import grace

from .helpers import spawn_worker, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

LEASE = 2.0
GRACE = grace(LEASE)
"""Slots the leader sees later than this were missed (3 s with a 2 s lease)."""
POLICIES = ("latest", "all", "none")
SECOND = timedelta(seconds=1)


def stop(worker: subprocess.Popen[bytes]) -> int:
    worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(timeout=30)
    finally:
        worker.kill()


@contextlib.contextmanager
def fleet(dsn: str, logs: Path, n: int = 3) -> Iterator[list[subprocess.Popen[bytes]]]:
    logs.mkdir(exist_ok=True)
    workers = [
        spawn_worker(
            "tests.apps.periodic",
            dsn,
            logs / f"worker-{i}.log",
            "--lease",
            str(LEASE),
            "--poll-interval",
            "0.5",
            "--worker-id",
            f"{logs.name}-{i}",
        )
        for i in range(n)
    ]
    try:
        yield workers
    finally:
        codes = [stop(w) for w in workers]
        assert codes == [0] * n, [(logs / f"worker-{i}.log").read_text()[-2000:] for i in range(n)]


async def slots(conn: Any, policy: str) -> list[Any]:
    return await conn.fetch(
        "SELECT scheduled_at, created_at, status, idempotency_key FROM pgworker.jobs"
        " WHERE type = 'tick' AND payload->>'policy' = $1 ORDER BY scheduled_at, id",
        policy,
    )


def contiguous(found: list[datetime]) -> bool:
    return all(b - a == SECOND for a, b in itertools.pairwise(found))


async def test_three_workers_enqueue_each_one_second_slot_once_and_catch_up_by_policy(
    dsn: str, conn: Any, tmp_path: Path
):
    started = await conn.fetchval("SELECT now()")
    with fleet(dsn, tmp_path / "first"):
        await wait_for(lambda: count_at_least(conn, 10), timeout=60, every=0.2)
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 0 FROM pgworker.jobs WHERE status IN ('pending', 'running')"
                " AND scheduled_at < now() - interval '3 seconds'"
            ),
            timeout=30,
            every=0.2,
        )
    ran = {p: await slots(conn, p) for p in POLICIES}
    for policy, jobs in ran.items():
        found = [j["scheduled_at"] for j in jobs]
        # One job per slot: no slot twice, none missed while the workers ran, each key the slot's.
        assert len(found) == len(set(found)) >= 10, policy
        assert contiguous(found), (policy, found)
        assert found[0] > started  # the first start catches nothing up
        assert [j["idempotency_key"] for j in jobs] == [
            f"periodic:tick-{policy}:{s.strftime('%Y-%m-%dT%H:%M:%SZ')}" for s in found
        ]
        lags = [(j["created_at"] - j["scheduled_at"]).total_seconds() for j in jobs]
        assert max(lags) < 5.0, lags
        assert statistics.median(lags) < 1.0, lags
        assert all(j["status"] == "completed" for j in jobs if j["scheduled_at"] < found[-3])
    # The three schedules moved together: the last slot before the stop is the same for each.
    last = {jobs[-1]["scheduled_at"] for jobs in ran.values()}
    assert len(last) == 1
    stopped_at = last.pop()

    # Stopped for several slots, more than the grace: those slots were missed.
    await wait_for(
        lambda: conn.fetchval("SELECT now() > $1::timestamptz + interval '8 seconds'", stopped_at),
        timeout=30,
        every=0.2,
    )
    with fleet(dsn, tmp_path / "second"):
        await wait_for(lambda: count_after(conn, stopped_at + 8 * SECOND), timeout=60, every=0.2)
    after = {
        p: [j for j in await slots(conn, p) if j["scheduled_at"] > stopped_at] for p in POLICIES
    }
    # The first pass after the restart enqueued every schedule's due slots in one statement.
    first_pass = min(j["created_at"] for jobs in after.values() for j in jobs)
    firsts = {
        p: [j["scheduled_at"] for j in after[p] if j["created_at"] == first_pass] for p in POLICIES
    }
    later = {
        p: [j["scheduled_at"] for j in after[p] if j["created_at"] > first_pass] for p in POLICIES
    }
    for policy in POLICIES:
        assert firsts[policy], (policy, after[policy])
        assert contiguous(firsts[policy] + later[policy]), (policy, firsts[policy], later[policy])
    # "all": every slot of the stop, none missing.
    assert firsts["all"][0] == stopped_at + SECOND
    missed = len(firsts["all"]) - len(firsts["none"])
    assert missed >= 8 - GRACE - 1, firsts
    # "none": only the slots on time (within the grace); "latest": those and the last missed.
    assert firsts["none"][-1] == firsts["latest"][-1] == firsts["all"][-1]
    assert len(firsts["none"]) <= GRACE + 1, firsts["none"]
    assert firsts["latest"] == [firsts["none"][0] - SECOND, *firsts["none"]]


async def count_at_least(conn: Any, n: int) -> bool:
    counts = await conn.fetch(
        "SELECT payload->>'policy' AS p, count(*) AS n FROM pgworker.jobs GROUP BY 1"
    )
    return len(counts) == 3 and all(r["n"] >= n for r in counts)


async def count_after(conn: Any, moment: datetime) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT count(DISTINCT payload->>'policy') = 3 FROM pgworker.jobs"
            " WHERE scheduled_at > $1::timestamptz + interval '3 seconds'",
            moment,
        )
    )
