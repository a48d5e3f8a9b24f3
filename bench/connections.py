"""Server connections per worker (issue 22, item 2): 16 worker processes at concurrency 10 whose
handlers use steps, milestones and transactional steps, sampled from pg_stat_activity every
50 ms while they run at full load and once they are idle; directly, then through one PgBouncer in
transaction mode (`default_pool_size` 10, workers in pooler mode, polling).

    PYTHONPATH=. python -m bench.connections [--dsn DSN] [--workers 16] [--jobs 2000]

In a database of its own (`bench_connections`, dropped at the end). Direct mode: connections by
the workers' application_name (`pgworker:<id>`, `pgworker:<id>:steps`, `pgworker-listen:<id>`),
per worker. Pooler mode: the server's sessions are PgBouncer's, whatever the workers hold: every
session of the database but the sampler's, and that divided by the number of workers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

import pgworker
from tests.connections import sample
from tests.pgbouncer import PgBouncer

DATABASE = "bench_connections"
ROOT = Path(__file__).resolve().parent.parent
HOLD = 0.3
TX_HOLD = 0.02


def spawn(dsn: str, worker_id: str, concurrency: int, log: Path, *extra: str) -> Any:
    env = {k: v for k, v in os.environ.items() if k not in ("PGWORKER_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "pgworker", "run", "tests.apps.conns", "--dsn", dsn),
            *("--concurrency", str(concurrency), "--worker-id", worker_id, *extra),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=env,
        cwd=ROOT,
    )


async def server_sessions(conn: Any) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    )


async def enqueue(conn: Any, jobs: int) -> None:
    specs = [
        pgworker.JobSpec(
            "tx" if i % 2 else "plain", {"hold": HOLD * (i % 8) / 4, "tx_hold": TX_HOLD}
        )
        for i in range(jobs)
    ]
    await pgworker.enqueue_many(conn, specs)


async def pending(conn: Any) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE status IN ('pending', 'running')"
        )
    )


async def measure(
    conn: Any, dsn: str, args: argparse.Namespace, pooler: bool, logs: Path
) -> dict[str, Any]:
    ids = [f"bc-{i}" for i in range(args.workers)]
    extra = ["--pooler"] if pooler else []
    procs = [spawn(dsn, w, args.concurrency, logs / f"{w}.log", *extra) for w in ids]
    try:
        deadline = time.monotonic() + 60
        while len(await conn.fetch("SELECT 1 FROM pgworker.workers")) < args.workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers did not start: see {logs}")
            await asyncio.sleep(0.1)
        await enqueue(conn, args.jobs)
        started = time.monotonic()
        busy_totals: list[int] = []
        busy_per_worker: list[int] = []
        busy_main: list[int] = []
        while await pending(conn):
            if time.monotonic() - started > 300:
                raise RuntimeError("the jobs did not finish within 300 s")
            s = await sample(conn)
            busy_totals.append(await server_sessions(conn))
            if not pooler:
                busy_per_worker += [s.total(w) for w in ids]
                busy_main += [s.main[w] for w in ids]
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - started
        await asyncio.sleep(2.0)  # past the steps' connections' idle lifetime (1 s)
        idle_totals = []
        idle_per_worker: list[int] = []
        for _ in range(20):
            s = await sample(conn)
            idle_totals.append(await server_sessions(conn))
            if not pooler:
                idle_per_worker += [s.total(w) for w in ids]
            await asyncio.sleep(0.05)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        await conn.execute("DELETE FROM pgworker.jobs")
        await conn.execute("DELETE FROM pgworker.workers")
    n = args.workers
    out: dict[str, Any] = {
        "seconds": round(elapsed, 2),
        "server sessions, busy: max": max(busy_totals),
        "server sessions, busy: mean": round(statistics.fmean(busy_totals), 1),
        "server sessions, idle: max": max(idle_totals),
        "per worker, busy: max sessions / workers": round(max(busy_totals) / n, 2),
        "per worker, busy: mean": round(statistics.fmean(busy_totals) / n, 2),
        "per worker, idle: mean": round(statistics.fmean(idle_totals) / n, 2),
    }
    if not pooler:
        out |= {
            "per worker, busy: max": max(busy_per_worker),
            "per worker (claims, shared, LISTEN), busy: max": max(busy_main),
            "per worker, idle: max": max(idle_per_worker),
        }
    return out


async def run(args: argparse.Namespace) -> None:
    server = await asyncpg.connect(args.dsn)
    await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
    await server.execute(f"CREATE DATABASE {DATABASE}")
    dsn = args.dsn.rsplit("/", 1)[0] + "/" + DATABASE
    logs = Path(tempfile.mkdtemp(prefix="pgw-bench-connections-"))
    try:
        conn = await asyncpg.connect(dsn)
        try:
            await pgworker.migrate(conn)
            print(f"{args.workers} workers, concurrency {args.concurrency}, {args.jobs} jobs")
            print("direct:", await measure(conn, dsn, args, False, logs))
            with PgBouncer(args.dsn, pool_size=10) as bouncer:
                pooled = await measure(conn, bouncer.dsn(dsn), args, True, logs)
            print("pooler (PgBouncer, default_pool_size 10):", pooled)
        finally:
            await conn.close()
    finally:
        await server.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        await server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dsn",
        default=os.environ.get(
            "PGWORKER_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2000)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
