"""Cluster-wide limits (issue 23, items 2-4), with three real `pgworker run` processes of
tests.apps.limits: `max_running` of a task and of a queue (set from the CLI while the workers
run), `max_running_per_key` and its round-robin between keys, and `rate_limit`. What ran at once
is read twice: sampled from `jobs` while the jobs run, and from the attempts' intervals in
`job_attempts` afterwards (each attempt runs from its claim to its outcome's write). The workers
poll once a minute: only the wake-ups explain a prompt claim after a limited job ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

import pgworker
from pgworker import ConfigError, JobSpec

from .helpers import cli, spawn_worker, wait_for
from .pgbouncer import PgBouncer, available

pytestmark = pytest.mark.asyncio(loop_scope="session")

WORKERS = 3
POLL = "60"


def stop(worker: subprocess.Popen[bytes]) -> int:
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
