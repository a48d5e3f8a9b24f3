"""Cluster-wide limits, with three real `pgworker run` processes of
tests.apps.limits: `max_running` of a task and of a queue (set from the CLI while the workers
run), `max_running_per_key` and its round-robin between keys, and `rate_limit`. What ran at once
is read twice: sampled from `jobs` while the jobs run, and from the attempts' intervals in
`job_attempts` afterwards (each attempt runs from its claim to its outcome's write). The workers
poll once a minute: only the wake-ups explain a prompt claim after a limited job ends."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

import pgworker
from pgworker import ConfigError, JobSpec
from pgworker._db import files
from pgworker._db.queries import queries

from .helpers import ROOT, cli, serving_guarded, spawn_worker, wait_for
from .pgbouncer import PgBouncer, available

pytestmark = pytest.mark.asyncio(loop_scope="session")

WORKERS = 3
POLL = "60"


def stop(worker: subprocess.Popen[bytes]) -> int:
    """Stop `worker` (SIGTERM) and return its exit status; one that has ended is not signalled
    again (a second SIGTERM while it exits would kill it)."""
    if worker.poll() is not None:
        return worker.returncode
    worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(timeout=30)
    finally:
        worker.kill()


class Logs(list[Path]):
    pids: list[int]


@contextlib.contextmanager
def fleet(dsn: str, tmp_path: Path, *args: str) -> Iterator[Logs]:
    """Three workers of tests.apps.limits at concurrency 10 on queues default and limited."""
    logs = Logs(tmp_path / f"worker-{i}.log" for i in range(WORKERS))
    workers = [
        spawn_worker(
            "tests.apps.limits",
            dsn,
            log,
            "--queue",
            "default",
            "--queue",
            "limited",
            "--concurrency",
            "10",
            "--poll-interval",
            POLL,
            "--worker-id",
            f"limits-{i}",
            *args,
        )
        for i, log in enumerate(logs)
    ]
    logs.pids = [w.pid for w in workers]
    try:
        yield logs
    finally:
        codes = [stop(w) for w in workers]
        assert codes == [0] * WORKERS, [log.read_text()[-2000:] for log in logs]


async def ready(conn: Any) -> None:
    await wait_for(lambda: conn.fetchval("SELECT count(*) = 3 FROM pgworker.workers"), timeout=60)


class Sampler:
    """The most jobs of one kind seen running at once, sampled from `jobs` until stopped."""

    def __init__(self, conn: Any, sql: str, *args: Any) -> None:
        self.conn, self.sql, self.args = conn, sql, args
        self.most = 0
        self.samples = 0

    async def run(self, done: anyio.Event) -> None:
        while not done.is_set():
            self.most = max(self.most, await self.conn.fetchval(self.sql, *self.args))
            self.samples += 1
            await anyio.sleep(0.005)


@contextlib.asynccontextmanager
async def sampling(dsn: str, sql: str, *args: Any) -> AsyncIterator[Sampler]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    sampler = Sampler(conn, sql, *args)
    done = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler.run, done)
            try:
                yield sampler
            finally:
                done.set()
    finally:
        await conn.close()


async def most_at_once(conn: Any, where: str, *args: Any, by: str = "1") -> int:
    """The most attempts whose [started_at, finished_at] intervals overlap, per `by`."""
    return await conn.fetchval(
        f"""
        WITH a AS (
            SELECT {by} AS grp, a.started_at, a.finished_at
            FROM pgworker.job_attempts AS a JOIN pgworker.jobs AS j ON j.id = a.job_id
            WHERE {where}
        ), edges AS (
            SELECT grp, started_at AS at, 1 AS delta FROM a
            UNION ALL
            SELECT grp, finished_at, -1 FROM a
        )
        SELECT coalesce(max(running), 0) FROM (
            SELECT sum(delta) OVER (PARTITION BY grp ORDER BY at, delta
                                    ROWS UNBOUNDED PRECEDING) AS running
            FROM edges
        ) AS s
        """,
        *args,
    )


RUNNING_OF_TYPE = "SELECT count(*) FROM pgworker.jobs WHERE status = 'running' AND type = $1"


async def test_max_running_of_a_task_holds_across_three_workers(dsn, conn, tmp_path):
    # Enqueued before the workers start: each of the three claims at once when it starts, so
    # that a limit each worker kept for itself would show six running.
    await pgworker.enqueue_many(conn, [JobSpec("capped", {"seconds": 0.2}) for _ in range(30)])
    async with sampling(dsn, RUNNING_OF_TYPE, "capped") as sampler:
        with fleet(dsn, tmp_path):
            # 15 rounds of 0.2 s: the ends wake the workers, not their polls (once a minute).
            await wait_for(
                lambda: conn.fetchval(
                    "SELECT count(*) = 30 FROM pgworker.jobs WHERE status = 'completed'"
                ),
                timeout=60,
            )
    assert sampler.samples > 50
    assert sampler.most == 2
    assert await most_at_once(conn, "j.type = 'capped'") == 2
    assert await conn.fetchval(
        "SELECT count(*) FROM pgworker.job_attempts WHERE type = 'capped'"
    ) == 30  # fmt: skip


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of these processes so far (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def test_a_held_back_worker_does_not_spin(dsn, conn, tmp_path):
    """Two long `capped` jobs hold the limit: the ten waiting ones cause no claim in a loop
    (measured by the workers' CPU while nothing ends)."""
    with fleet(dsn, tmp_path) as logs:
        await ready(conn)
        await pgworker.enqueue_many(conn, [JobSpec("capped", {"seconds": 8}) for _ in range(12)])
        await wait_for(
            lambda: conn.fetchval(RUNNING_OF_TYPE + " HAVING count(*) = 2", "capped"), timeout=30
        )
        pids = [int(p) for p in logs.pids]
        before = cpu_seconds(pids)
        await anyio.sleep(3)
        spent = cpu_seconds(pids) - before
        assert await conn.fetchval(RUNNING_OF_TYPE, "capped") == 2
        # Heartbeats and the like: a few hundredths of a second; claiming in a loop, seconds.
        assert spent < 0.5, spent


async def test_a_queue_limit_set_from_the_cli_holds_at_once_and_is_lifted(dsn, conn, tmp_path):
    with fleet(dsn, tmp_path):
        await ready(conn)
        limit = cli("queue", "limit", "limited", "2", "--dsn", dsn)
        assert limit.returncode == 0, limit.stderr
        running = "SELECT count(*) FROM pgworker.jobs WHERE status = 'running' AND queue = $1"
        async with sampling(dsn, running, "limited") as sampler:
            await pgworker.enqueue_many(
                conn, [JobSpec("plain", {"seconds": 0.2}, queue="limited") for _ in range(30)]
            )
            await wait_for(
                lambda: conn.fetchval(
                    "SELECT count(*) >= 20 FROM pgworker.jobs WHERE status = 'completed'"
                ),
                timeout=30,
            )
        assert sampler.most == 2
        assert await most_at_once(conn, "j.queue = 'limited'") == 2

        lifted = cli("queue", "limit", "limited", "--none", "--dsn", dsn)
        assert lifted.returncode == 0, lifted.stderr
        await pgworker.enqueue_many(
            conn, [JobSpec("plain", {"seconds": 1.0}, queue="limited") for _ in range(12)]
        )
        # Without the limit, the twelve run together (the lift woke every worker).
        await wait_for(lambda: conn.fetchval(running + " HAVING count(*) >= 6", "limited"))
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 42 FROM pgworker.jobs WHERE status = 'completed'"
            ),
            timeout=30,
        )
    log = await conn.fetch(
        "SELECT action FROM pgworker.operator_log WHERE queue = 'limited' ORDER BY id"
    )
    assert len(log) == 2


async def test_per_key_one_at_a_time_while_keys_overlap(dsn, conn, tmp_path):
    with fleet(dsn, tmp_path):
        await ready(conn)
        specs = [
            JobSpec("per-key", {"seconds": 0.2}, concurrency_key=f"customer-{i % 3}")
            for i in range(30)
        ]
        per_key = (
            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM pgworker.jobs "
            "WHERE status = 'running' AND type = 'per-key' GROUP BY concurrency_key) AS k"
        )
        async with sampling(dsn, per_key) as sampler:
            await pgworker.enqueue_many(conn, specs)
            await wait_for(
                lambda: conn.fetchval(
                    "SELECT count(*) = 30 FROM pgworker.jobs WHERE status = 'completed'"
                ),
                timeout=30,
            )
    assert sampler.most == 1
    assert await most_at_once(conn, "j.type = 'per-key'", by="j.concurrency_key") == 1
    # The keys ran side by side: three at once at some moment.
    assert await most_at_once(conn, "j.type = 'per-key'") == 3


async def test_keys_take_turns_a_small_tenant_is_not_starved(dsn, conn, tmp_path):
    await pgworker.enqueue_many(
        conn, [JobSpec("per-key", {"seconds": 0.01}, concurrency_key="A") for _ in range(1000)]
    )
    await pgworker.enqueue_many(
        conn, [JobSpec("per-key", {"seconds": 0.01}, concurrency_key="B") for _ in range(10)]
    )
    with fleet(dsn, tmp_path):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 10 FROM pgworker.jobs "
                "WHERE concurrency_key = 'B' AND status = 'completed'"
            ),
            timeout=60,
        )
    starts = await conn.fetch(
        "SELECT j.concurrency_key AS key, a.started_at FROM pgworker.job_attempts AS a "
        "JOIN pgworker.jobs AS j ON j.id = a.job_id ORDER BY a.started_at, a.job_id"
    )
    a_starts = [r["started_at"] for r in starts if r["key"] == "A"]
    b_starts = [r["started_at"] for r in starts if r["key"] == "B"]
    assert len(b_starts) == 10
    # B's last start came before A's 100th (with one job per key at a time, round-robin puts
    # it near A's 11th).
    assert len(a_starts) < 100 or max(b_starts) < a_starts[99]
    assert sum(1 for t in a_starts if t < max(b_starts)) <= 15


async def test_a_rate_limit_holds_in_every_window_without_retries(dsn, conn, tmp_path):
    with fleet(dsn, tmp_path):
        await ready(conn)
        await pgworker.enqueue_many(conn, [JobSpec("rated", {}) for _ in range(30)])
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 30 FROM pgworker.jobs WHERE status = 'completed'"
            ),
            timeout=30,
        )
    starts = [
        r["started_at"]
        for r in await conn.fetch(
            "SELECT started_at FROM pgworker.job_attempts WHERE type = 'rated' ORDER BY 1"
        )
    ]
    assert len(starts) == 30  # one attempt each: waiting records none
    per_second: dict[Any, int] = {}
    for t in starts:
        per_second[t.replace(microsecond=0)] = per_second.get(t.replace(microsecond=0), 0) + 1
    assert max(per_second.values()) <= 5
    # Stronger: a sliding window. Any six starts span at least a second.
    assert all(b - a >= timedelta(seconds=1) for a, b in zip(starts, starts[5:], strict=False))
    # And the limit was used, not slept through: 30 starts in well under 10 seconds.
    assert starts[-1] - starts[0] < timedelta(seconds=8)
    assert await conn.fetchval("SELECT max(retry_count) FROM pgworker.jobs") == 0


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_running": 0}, "max_running"),
        ({"max_running": "2"}, "max_running"),
        ({"max_running_per_key": 0}, "max_running_per_key"),
        ({"rate_limit": "10/fortnight"}, "rate_limit"),
        ({"rate_limit": "0/s"}, "rate_limit"),
        ({"rate_limit": "10001/s"}, "rate_limit"),
        ({"rate_limit": 10}, "rate_limit"),
    ],
)
async def test_bad_limits_are_refused_at_registration(options, field):
    registry = pgworker.Registry()
    with pytest.raises(ConfigError) as raised:
        registry.task("t", **options)
    assert raised.value.field == field
    assert "t" not in [t.name for t in registry]


@pytest.mark.skipif(not available(), reason="needs PgBouncer (/usr/sbin/pgbouncer)")
async def test_limits_hold_through_a_transaction_pooler(dsn, conn, server_dsn, tmp_path):
    """Two pooler-mode workers through PgBouncer in transaction mode, polling (no LISTEN): the
    advisory locks of a limited claim are its transaction's, which the pooler keeps on one
    server session."""
    await pgworker.enqueue_many(conn, [JobSpec("capped", {"seconds": 0.1}) for _ in range(20)])
    with PgBouncer(server_dsn, pool_size=4) as bouncer:
        logs = [tmp_path / f"pooled-{i}.log" for i in range(2)]
        workers = [
            spawn_worker(
                "tests.apps.limits",
                bouncer.dsn(dsn),
                log,
                "--pooler",
                "--concurrency",
                "5",
                "--poll-interval",
                "0.2",
            )
            for log in logs
        ]
        try:
            async with sampling(dsn, RUNNING_OF_TYPE, "capped") as sampler:
                await wait_for(
                    lambda: conn.fetchval(
                        "SELECT count(*) = 20 FROM pgworker.jobs WHERE status = 'completed'"
                    ),
                    timeout=60,
                )
        finally:
            codes = [stop(w) for w in workers]
            assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
    assert sampler.most == 2
    assert await most_at_once(conn, "j.type = 'capped'") == 2


async def test_a_draining_worker_passes_the_room_of_its_limited_jobs_on(dsn, conn, tmp_path):
    """A worker that stops claims nothing more: when its limited jobs end, it tells the others,
    which claim at once rather than at their poll (once a minute here)."""
    await pgworker.enqueue_many(conn, [JobSpec("capped", {"seconds": 2}) for _ in range(2)])
    first = spawn_worker("tests.apps.limits", dsn, tmp_path / "first.log", "--poll-interval", POLL)
    try:
        await wait_for(lambda: conn.fetchval(RUNNING_OF_TYPE + " HAVING count(*) = 2", "capped"))
        await pgworker.enqueue_many(conn, [JobSpec("capped", {"seconds": 0}) for _ in range(4)])
        second = spawn_worker(
            "tests.apps.limits",
            dsn,
            tmp_path / "second.log",
            "--poll-interval",
            POLL,
            "--worker-id",
            "second",
        )
        try:
            await wait_for(
                lambda: conn.fetchval("SELECT count(*) = 2 FROM pgworker.workers"), timeout=60
            )
            first.send_signal(signal.SIGTERM)  # drains its two jobs, claims nothing
            await wait_for(
                lambda: conn.fetchval(
                    "SELECT count(*) = 6 FROM pgworker.jobs WHERE status = 'completed'"
                ),
                timeout=20,
            )
            ran = await conn.fetchval(
                "SELECT count(*) FROM pgworker.job_attempts AS a JOIN pgworker.jobs AS j "
                "ON j.id = a.job_id WHERE j.payload = '{\"seconds\": 0}' "
                "AND a.worker_id = 'second'"
            )
            assert ran == 4
            assert first.wait(timeout=30) == 0, (tmp_path / "first.log").read_text()[-2000:]
        finally:
            assert stop(second) == 0, (tmp_path / "second.log").read_text()[-2000:]
    finally:
        assert stop(first) == 0, (tmp_path / "first.log").read_text()[-2000:]


async def test_drain_runs_the_jobs_of_limited_tasks_and_queues(conn):
    """pgworker.testing.drain runs one job at a time: it takes the jobs of limited tasks and of
    queues with a limit too (none can be exceeded), rather than stopping before them."""
    from pgworker import testing
    from tests.apps.limits import registry

    await conn.execute("INSERT INTO pgworker.queues (name, max_running) VALUES ('limited', 1)")
    await pgworker.enqueue_many(
        conn,
        [JobSpec("plain", {"seconds": 0}, queue="limited") for _ in range(3)]
        + [JobSpec("capped", {"seconds": 0}) for _ in range(3)],
    )
    await testing.drain(conn, registry, queues=("default", "limited"))
    assert await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs WHERE status = 'completed'"
    ) == 6  # fmt: skip


# --- limits set by SQL mid-claim, rows edited by hand ----------------------------------------


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
