"""How long a worker's outcome writes wait for its shared connection while its maintenance works
through a backlog on that same connection: retention of `--finished` jobs
past their age, or the rescue of `--expired` jobs whose worker died.

    PYTHONPATH=. python -m bench.shared_wait [--dsn DSN] [--finished 100000] [--expired 0]

In a database of its own (`bench_shared_wait`, dropped at the end): `--finished` completed jobs
that finished two days ago (each with its attempt, a step, a milestone and an event, as a job
that used them leaves), and `--expired` running jobs of a dead worker; then one worker
(concurrency 10, lease 2 s: a maintenance tick a second; retention of completed jobs 1 day,
queue gauges on with `--metrics`) runs `--jobs` no-op jobs at full speed meanwhile. Every turn
taken on the shared connection is timed (SharedConnection.acquire): how long its borrower waited
for it, and how long it held it, by borrower (the maintenance by what it was doing).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import defaultdict
from typing import Any

import asyncpg

import pgworker
from tests.turns import Turn, timed_turns

DATABASE = "bench_shared_wait"


async def seed(admin: Any, finished: int, expired: int, jobs: int) -> None:
    await admin.execute(
        """WITH j AS (
            INSERT INTO pgworker.jobs (type, status, attempts, claimed_at, finished_at, result)
            SELECT 'old', 'completed', 1, now() - interval '2 days', now() - interval '2 days',
                   '{"ok": true}'
            FROM generate_series(1, $1)
            RETURNING id, claimed_at, correlation_id
        ), a AS (
            INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id,
                                               correlation_id, started_at, outcome, finished_at)
            SELECT id, 1, 'old', 'default', 'gone', correlation_id, claimed_at, 'completed',
                   claimed_at FROM j
        ), s AS (
            INSERT INTO pgworker.job_steps (job_id, name, result, attempt, started_at)
            SELECT id, 'fetch', '{"rows": 10}', 1, claimed_at FROM j
        ), m AS (
            INSERT INTO pgworker.job_milestones (job_id, attempt, milestone, detail)
            SELECT id, 1, 'half', '{"n": 1}' FROM j
        )
        INSERT INTO pgworker.job_events (job_id, kind, actor, reason)
        SELECT id, 'replay', 'cli', 'bench' FROM j""",
        finished,
    )
    await admin.execute(
        """WITH j AS (
            INSERT INTO pgworker.jobs (type, status, attempts, claimed_at, worker_id,
                                       lease_expires_at, budget_started_at)
            SELECT 'noop', 'running', 1, now() - interval '1 minute', 'gone',
                   now() - interval '30 seconds', now() - interval '1 minute'
            FROM generate_series(1, $1)
            RETURNING id, claimed_at, correlation_id)
        INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id,
                                           correlation_id, started_at)
        SELECT id, 1, 'noop', 'default', 'gone', correlation_id, claimed_at FROM j""",
        expired,
    )
    await admin.execute(
        "INSERT INTO pgworker.jobs (type) SELECT 'noop' FROM generate_series(1, $1)", jobs
    )
    await admin.execute("VACUUM ANALYZE")


async def run(args: argparse.Namespace) -> list[str]:
    server = await asyncpg.connect(args.dsn)
    await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
    await server.execute(f"CREATE DATABASE {DATABASE}")
    dsn = args.dsn.rsplit("/", 1)[0] + "/" + DATABASE
    admin = await asyncpg.connect(dsn)
    try:
        await pgworker.migrate(admin)
        await seed(admin, args.finished, args.expired, args.jobs)
        registry = pgworker.Registry()

        @registry.task("noop", max_retries=0)
        async def noop(ctx: Any, payload: Any) -> None:
            pass

        options: dict[str, Any] = {"metrics_port": args.metrics} if args.metrics else {}
        worker = pgworker.Worker(
            registry, dsn, concurrency=10, lease=2.0, retain_completed=86400, **options
        )
        began = time.perf_counter()
        backlog_gone = None
        with timed_turns() as turns:
            async with worker:
                while time.perf_counter() - began < args.timeout:
                    left = await admin.fetchval(
                        "SELECT count(*) FROM pgworker.jobs WHERE type = 'old' "
                        "OR status = 'running' AND worker_id = 'gone'"
                    )
                    if left == 0 and backlog_gone is None:
                        backlog_gone = time.perf_counter() - began
                    pending = await admin.fetchval(
                        "SELECT count(*) FROM pgworker.jobs WHERE status IN ('pending', 'running')"
                    )
                    if backlog_gone is not None and pending == 0:
                        break
                    await asyncio.sleep(0.2)
        done = await admin.fetchval("SELECT count(*) FROM pgworker.jobs WHERE type = 'noop'")
    finally:
        await admin.close()
        await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        await server.close()
    return report(turns, args, backlog_gone, done, time.perf_counter() - began)


def report(
    turns: list[Turn],
    args: argparse.Namespace,
    backlog_gone: float | None,
    done: int,
    took: float,
) -> list[str]:
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for who, waited, held in turns:
        by[who].append((waited, held))

    def ms(values: list[float], q: float) -> str:
        if not values:
            return "-"
        values = sorted(values)
        return f"{values[min(len(values) - 1, int(q * len(values)))] * 1000:.1f}"

    lines = [
        f"{args.finished:,} finished jobs past retention, {args.expired:,} expired, "
        f"{args.jobs:,} no-op jobs; backlog gone after "
        f"{'-' if backlog_gone is None else f'{backlog_gone:.1f} s'}, {done:,} jobs in "
        f"{took:.1f} s",
        "",
        "| borrower | turns | wait p50 ms | wait p99 | wait max | hold p50 ms | hold max |",
        "|---|---|---|---|---|---|---|",
    ]
    for who, rows in sorted(by.items()):
        waits = [w for w, _ in rows]
        holds = [h for _, h in rows]
        lines.append(
            f"| {who} | {len(rows)} | {ms(waits, 0.5)} | {ms(waits, 0.99)} | "
            f"{max(waits) * 1000:.1f} | {statistics.median(holds) * 1000:.1f} | "
            f"{max(holds) * 1000:.1f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--finished", type=int, default=100_000)
    parser.add_argument("--expired", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--metrics", type=int, help="serve metrics on this port (queue gauges on)")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    print("\n".join(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
