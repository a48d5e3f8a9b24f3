"""Hostile tests of the cluster-wide limits (issue 23, items 2-4), against the real PostgreSQL:
a hostile operator (limits set by SQL mid-claim, rows edited by hand) and a hostile database
(rate windows and key cursors holding what no claim writes). Each claim here is the worker's
own pair of statements, limits_lock.sql then job_claim_limited.sql, in one transaction."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import Any

import anyio
import asyncpg
import pytest

import pgworker
from pgworker import JobSpec
from pgworker._db import files
from pgworker._db.queries import queries

from .helpers import ROOT, serving_guarded, spawn_worker, wait_for
from .pgbouncer import PgBouncer, available
from .test_limits import RUNNING_OF_TYPE, most_at_once, sampling, stop

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


WINDOWS = {
    "nulls": "ARRAY[NULL, now() - interval '1 s', NULL]::timestamptz[]",
    "future": "ARRAY[now() + interval '1 h', now() + interval '1 h', 'infinity']::timestamptz[]",
    "old_100k": "ARRAY(SELECT now() - interval '2 min' - g * interval '1 ms'"
    " FROM generate_series(1, 100000) AS g)",
    "recent_100k": "ARRAY(SELECT now() - interval '1 s' FROM generate_series(1, 100000))",
    "empty": "'{}'::timestamptz[]",
    "unsorted": "ARRAY[now() - interval '1 s', '-infinity', now() - interval '50 s']"
    "::timestamptz[]",
}
ALLOWED = {"nulls": 2, "future": 3, "old_100k": 3, "recent_100k": 0, "empty": 3, "unsorted": 1}


@pytest.mark.parametrize("window", list(WINDOWS))
async def test_a_rate_window_edited_by_hand_is_served_and_never_exceeded(conn, window):
    """3 starts per minute; the window row holds what no claim writes. The claim keeps working
    and allows only what the window's real starts leave."""
    await pgworker.enqueue_many(conn, [JobSpec("rated") for _ in range(10)])
    await conn.execute(
        f"INSERT INTO pgworker.rate_windows (name, starts) VALUES ('type:rated', {WINDOWS[window]})"
    )
    await conn.execute(
        "INSERT INTO pgworker.rate_windows (name, starts) VALUES ('type:other', "
        + WINDOWS["recent_100k"]
        + ")"
    )
    first = await claim(conn, "rated", rate=(3, 60))
    assert len(first) == ALLOWED[window]
    assert await claim(conn, "rated", rate=(3, 60)) == []
    wait = await Q.rate_next(conn, [("type:rated", 3, 60)])
    assert wait is not None and 0 < wait <= 60
    starts = await conn.fetchval(
        "SELECT starts FROM pgworker.rate_windows WHERE name = 'type:rated'"
    )
    assert None not in starts
    if first:  # rewritten by the claim: only its real starts are kept
        assert len(starts) == 3


async def test_a_key_cursor_edited_by_hand_is_served(conn):
    """The cursor points at a key that no longer exists, then at a key of 100,000 characters,
    then past every key: the keys keep taking turns."""
    await pgworker.enqueue_many(
        conn, [JobSpec("keyed", concurrency_key=k) for k in "abc" for _ in range(3)]
    )
    await conn.execute(
        "INSERT INTO pgworker.key_cursors (queue, type, last_key) VALUES ('default', 'keyed', 'bb')"
    )
    rows = await claim(conn, "keyed", per_key=1, limit=1)
    assert [r["concurrency_key"] for r in rows] == ["c"]
    await conn.execute("UPDATE pgworker.key_cursors SET last_key = repeat('b', 100000)")
    rows = await claim(conn, "keyed", per_key=1, limit=1)
    assert [r["concurrency_key"] for r in rows] == ["a"]  # c is at its limit: a is next after it
    await conn.execute("UPDATE pgworker.key_cursors SET last_key = repeat(chr(1114111), 50)")
    rows = await claim(conn, "keyed", per_key=1, limit=5)
    assert [r["concurrency_key"] for r in rows] == ["b"]


async def test_a_worker_killed_holding_limited_jobs_frees_them_after_the_lease(dsn, conn, tmp_path):
    """Two workers, lease 2 s; the one holding the two `capped` jobs (max_running=2) is
    SIGKILLed. Its jobs count until the rescue hands them back; then the survivor takes them,
    never more than 2 running at once."""
    args = ("--concurrency", "5", "--lease", "2", "--poll-interval", "0.5")
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    workers = [
        spawn_worker("tests.apps.limits", dsn, log, *args, "--worker-id", f"w{i}")
        for i, log in enumerate(logs)
    ]
    try:
        await wait_for(
            lambda: conn.fetchval("SELECT count(*) = 2 FROM pgworker.workers"), timeout=30
        )
        await pgworker.enqueue_many(conn, [JobSpec("capped", {"seconds": 3}) for _ in range(6)])
        async with sampling(dsn, RUNNING_OF_TYPE, "capped") as sampler:
            holder = await wait_for(
                lambda: conn.fetchval(
                    "SELECT min(worker_id) FROM pgworker.jobs WHERE status = 'running'"
                ),
                timeout=30,
            )
            victim = workers[int(holder[1:])]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(timeout=10)
            await wait_for(
                lambda: conn.fetchval(
                    "SELECT count(*) = 6 FROM pgworker.jobs WHERE status = 'completed'"
                ),
                timeout=60,
            )
        assert sampler.samples > 50
        assert sampler.most == 2
        rescued = await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE attempts > 1 AND type = 'capped'"
        )
        assert rescued >= 1
    finally:
        for w in workers:
            if w.poll() is None:
                stop(w)


def capped_registry(max_running: int, ran: list[int] | None = None) -> pgworker.Registry:
    """A release of task `cap` declaring `max_running`; `ran` collects the handler's job ids."""
    registry = pgworker.Registry()

    @registry.task("cap", max_running=max_running)
    async def cap(ctx: pgworker.JobContext, payload: dict) -> None:
        if ran is not None:
            ran.append(ctx.job_id)
        await anyio.sleep(payload.get("seconds", 0.05))

    return registry


async def test_two_releases_declaring_different_max_running_obey_the_larger_at_most(dsn, conn):
    """Old workers declare max_running=2, new ones 5: each counts every running `cap` job against
    its own number, so no more than 5 run at once, and the old ones only claim below 2."""
    await pgworker.enqueue_many(conn, [JobSpec("cap", {"seconds": 0.1}) for _ in range(60)])
    old_ran: list[int] = []
    async with (
        sampling(dsn, "SELECT count(*) FROM pgworker.jobs WHERE status = 'running'") as sampler,
        serving_guarded(capped_registry(2, old_ran), dsn, concurrency=10, worker_id="old"),
        serving_guarded(capped_registry(5), dsn, concurrency=10, worker_id="new"),
    ):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 60 FROM pgworker.jobs WHERE status = 'completed'"
            ),
            timeout=50,
        )
    assert sampler.most <= 5
    assert old_ran  # the old release still served
    assert await most_at_once(conn, "a.worker_id = 'old'") <= 2


async def test_a_handler_enqueueing_a_thousand_jobs_of_its_own_limited_task(dsn, conn):
    """The job enqueues 1,000 more of its own task (max_running=3) from inside its handler:
    they all run, never more than 3 at once."""
    registry = pgworker.Registry()

    @registry.task("fan", max_running=3)
    async def fan(ctx: pgworker.JobContext, payload: dict) -> None:
        if payload.get("root"):
            own = await asyncpg.connect(dsn)
            try:
                await pgworker.enqueue_many(own, [JobSpec("fan", {"n": n}) for n in range(1000)])
            finally:
                await own.close()

    await pgworker.enqueue(conn, "fan", {"root": True})
    async with serving_guarded(registry, dsn, concurrency=20):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 1001 FROM pgworker.jobs WHERE status = 'completed'"
            ),
            timeout=50,
        )
    assert await most_at_once(conn, "a.type = 'fan'") <= 3


async def test_keyed_jobs_of_a_task_without_a_per_key_limit_run_normally(dsn, conn):
    """A key given to a task that declares no max_running_per_key (limited otherwise, or not at
    all) is stored and ignored: the jobs run as any other."""
    registry = capped_registry(4)

    @registry.task("free")
    async def free(ctx: pgworker.JobContext, payload: dict) -> None:
        await anyio.sleep(0.05)

    await pgworker.enqueue_many(
        conn,
        [
            JobSpec(t, {"seconds": 0.2}, concurrency_key="same")
            for t in ("cap", "free")
            for _ in range(8)
        ],
    )
    async with serving_guarded(registry, dsn, concurrency=10):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 16 FROM pgworker.jobs WHERE status = 'completed'"
            ),
            timeout=30,
        )
    assert await most_at_once(conn, "a.type = 'cap'") == 4


HOLDER = """
import asyncio, sys
import asyncpg
from pgworker._db.queries import queries

async def main():
    conn = await asyncpg.connect(sys.argv[1], statement_cache_size=0)
    tx = conn.transaction()
    await tx.start()
    await queries("pgworker").limits_lock(conn, ["default"], ["capped"])
    print("locked", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.parametrize("pooled", [False, True], ids=["direct", "pgbouncer"])
async def test_a_process_killed_in_a_limited_claim_takes_its_lock_with_it(
    dsn, conn, server_dsn, pooled
):
    """A process SIGKILLed inside a limited claim's transaction, holding the limit's advisory
    lock (directly, or through PgBouncer in transaction mode): the next claim of the limit gets
    the lock within seconds, not never."""
    if pooled and not available():
        pytest.skip("needs PgBouncer (/usr/sbin/pgbouncer)")
    await pgworker.enqueue(conn, "capped")
    with contextlib.ExitStack() as stack:
        target = dsn
        if pooled:
            target = stack.enter_context(PgBouncer(server_dsn, pool_size=2)).dsn(dsn)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, target],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == b"locked\n"
            with pytest.raises(asyncpg.LockNotAvailableError):
                async with conn.transaction():
                    await conn.execute("SET LOCAL lock_timeout = '200ms'")
                    await Q.limits_lock(conn, ["default"], ["capped"])
            holder.kill()
            holder.wait(timeout=10)
            with anyio.fail_after(10):
                rows = await claim(conn, "capped", max_running=2)
        finally:
            holder.kill()
            holder.wait(timeout=10)
    assert len(rows) == 1


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found += plan_nodes(child)
    return found


async def explain_limited(conn: Any, **options: Any) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of one limited claim of `k` after its lock, rolled back: the
    rows its scans read and dropped in all (per loop figures times the loops)."""
    tr = conn.transaction()
    await tr.start()
    try:
        await Q.limits_lock(conn, ["default"], ["k"])
        sql = files.queries("pgworker")["job_claim_limited"]
        args = ["default", "k", 1, 10, "w", 30.0, 3, None, "off"]
        args += [options.get("max_running"), options.get("per_key"), None, None, False]
        raw = await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, *args)
    finally:
        await tr.rollback()
    plan = json.loads(raw)[0]["Plan"]
    every = plan_nodes(plan)
    return {
        "claimed": plan["Actual Rows"],
        "read": sum(n["Actual Rows"] * n["Actual Loops"] for n in every if n.get("Relation Name")),
        "dropped": sum(n.get("Rows Removed by Filter", 0) * n["Actual Loops"] for n in every),
        "seq_scans": [n["Relation Name"] for n in every if n["Node Type"] == "Seq Scan"],
    }


INSERT_KEYED = (
    "INSERT INTO pgworker.jobs (type, queue, payload, concurrency_key, correlation_id{}) "
    "SELECT 'k', 'default', '{{}}', {}, g::text{} FROM generate_series(1, $1) AS g"
)
RUNNING_COLUMNS = ", status, attempts, claimed_at, worker_id, lease_expires_at"
RUNNING_VALUES = ", 'running', 1, now(), 'w', now() + interval '1 hour'"


async def test_a_claim_of_one_key_with_a_huge_backlog_reads_by_index(conn):
    """100,000 pending jobs of one key: the claim probes the key, it does not read its
    backlog (a semi-join hashing every pending job of the task did)."""
    await conn.execute(INSERT_KEYED.format("", "'A'", ""), 100_000)
    await conn.execute("ANALYZE pgworker.jobs")
    cost = await explain_limited(conn, per_key=1)
    assert cost["claimed"] == 1
    assert cost["seq_scans"] == []
    assert cost["read"] < 1000, cost["read"]


async def test_a_claim_passing_thousands_of_keys_at_their_limit_is_linear(conn):
    """3,000 keys each at its limit (one running job each, one pending), and one key with room
    after them: the claim passes each key once, looking its running count up rather than
    scanning every running key for each (9,000,000 rows compared, seconds)."""
    await conn.execute(INSERT_KEYED.format("", "'key-' || lpad(g::text, 5, '0')", ""), 3000)
    await conn.execute(
        INSERT_KEYED.format(RUNNING_COLUMNS, "'key-' || lpad(g::text, 5, '0')", RUNNING_VALUES),
        3000,
    )
    await conn.execute(INSERT_KEYED.format("", "'z'", ""), 1)
    await conn.execute("ANALYZE pgworker.jobs")
    cost = await explain_limited(conn, per_key=1)
    assert cost["claimed"] == 1
    assert cost["dropped"] < 30_000, cost["dropped"]


ODD_KEYS = ["a", "A", "a ", "a  ", " a", "é", "e\u0301", "\U0001f600", "k" * 200, "ß", "ss"]


async def test_keys_that_sort_oddly_are_each_their_own_key(conn):
    """Keys equal under a loose reading (case, trailing spaces, é composed or not, ß and ss)
    are distinct keys: one claim takes one job of each, and the next claim none."""
    await pgworker.enqueue_many(
        conn, [JobSpec("keyed", concurrency_key=k) for k in ODD_KEYS for _ in range(2)]
    )
    rows = await claim(conn, "keyed", per_key=1, limit=100)
    assert sorted(r["concurrency_key"] for r in rows) == sorted(ODD_KEYS)
    assert await claim(conn, "keyed", per_key=1, limit=100) == []


async def test_a_queue_limit_lowered_below_what_runs_lets_them_end_and_claims_nothing(conn):
    """Five jobs of queue q run under max_running 5; the operator lowers it to 2: nothing is
    claimed until fewer than 2 run."""
    await pgworker.enqueue_many(conn, [JobSpec("t", queue="q") for _ in range(10)])
    await conn.execute("INSERT INTO pgworker.queues (name, max_running) VALUES ('q', 5)")
    running = await claim(conn, "t", queue="q", max_running=100)
    assert len(running) == 5
    await conn.execute("UPDATE pgworker.queues SET max_running = 2 WHERE name = 'q'")
    done = "UPDATE pgworker.jobs SET status = 'completed', lease_expires_at = NULL WHERE id = $1"
    for ended, room in ((0, 0), (2, 0), (3, 0), (4, 1)):
        for r in running[:ended]:
            await conn.execute(done, r["id"])
        assert len(await claim(conn, "t", queue="q", max_running=100)) == room
        assert await conn.fetchval(RUNNING.format("queue = 'q'")) <= 5 - ended + room
