"""Throughput of a fleet of 1 to 16 worker processes on one PostgreSQL, directly and through one
PgBouncer in transaction mode (issue 22, item 7): the curves of docs/scaling.md.

    PYTHONPATH=. python -m bench.fleet [--dsn DSN] [--workers 1,2,4,8,16] [--runs 1]
                                       [--modes direct,pooled] [--handlers noop,wait]
                                       [--noop-jobs 20000]

For each handler, mode and number of workers, in a database of its own (`bench_fleet`, emptied
between points and dropped at the end): the jobs are enqueued in one transaction once every
worker is up, the workers (concurrency 10 each, `--log-level warning`) drain them, and the
figures come from the drain's interval, the first attempt's start to the last attempt's end:

- `noop`: handlers that return at once, 20,000 jobs: what the machine does when every worker
  wants work all the time (bound by CPU);
- `wait`: handlers that wait 20 ms, 2,000 jobs per worker: a fleet bound by its slots (at most
  500 jobs/s per worker) until the machine runs out.

Printed per point: jobs/s, CPU per 1,000 jobs (workers, PostgreSQL, PgBouncer), the machine's
busy cores, WAL bytes per job (`pg_stat_wal`) and the most server sessions of the database at
once (direct: the workers'; pooled: every one but the benchmark's, all of them PgBouncer's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

import pgworker
from bench.measure import postmaster_of
from bench.procstat import TICK, CpuMeter, _stat
from tests.pgbouncer import PgBouncer

DATABASE = "bench_fleet"
ROOT = Path(__file__).resolve().parent.parent
NOOP_JOBS = 20_000
WAIT_JOBS_PER_WORKER = 2_000
WAIT_MS = 20


def spawn(dsn: str, worker_id: str, log: Path, pooler: bool) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGWORKER_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "pgworker", "run", "bench.apps.fleet_app", "--dsn", dsn),
            *("--concurrency", "10", "--worker-id", worker_id, "--log-level", "warning"),
            *(["--pooler"] if pooler else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=env,
        cwd=ROOT,
    )


def cpu_of(pid: int) -> float:
    """CPU seconds of one process with its threads (0 once it is gone)."""
    stat = _stat(pid)
    return 0.0 if stat is None else stat[2] / TICK


async def wal_bytes(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT wal_bytes FROM pg_stat_wal"))


async def point(
    conn: asyncpg.Connection,
    dsn: str,
    handler: str,
    workers: int,
    bouncer: PgBouncer | None,
    meter: CpuMeter,
    logs: Path,
    noop_jobs: int = NOOP_JOBS,
) -> dict[str, Any]:
    await conn.execute("TRUNCATE pgworker.jobs, pgworker.job_attempts, pgworker.workers")
    await conn.execute("VACUUM ANALYZE pgworker.jobs")
    await conn.execute("VACUUM ANALYZE pgworker.job_attempts")
    jobs = noop_jobs if handler == "noop" else WAIT_JOBS_PER_WORKER * workers
    worker_dsn = dsn if bouncer is None else bouncer.dsn(dsn)
    tag = f"{handler}-{'pooled' if bouncer else 'direct'}-{workers}"
    procs = [
        spawn(worker_dsn, f"fleet-{i}", logs / f"{tag}-{i}.log", bouncer is not None)
        for i in range(workers)
    ]
    try:
        deadline = time.monotonic() + 60
        while await conn.fetchval("SELECT count(*) FROM pgworker.workers") < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"the workers did not start: see {logs}/{tag}-*.log")
            await asyncio.sleep(0.05)
        cpu0 = [cpu_of(p.pid) for p in procs]
        bouncer0 = cpu_of(bouncer.pid) if bouncer and bouncer.pid else 0.0
        _, pg0, _, busy0, _ = meter.sample()
        wal0 = await wal_bytes(conn)
        t0 = time.monotonic()
        payload = {} if handler == "noop" else {"ms": WAIT_MS}
        async with conn.transaction():
            await pgworker.enqueue_many(conn, [pgworker.JobSpec(handler, payload)] * jobs)
        sessions = 0
        deadline = time.monotonic() + 600
        while await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE status <> 'completed'"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{tag}: the jobs did not finish within 600 s")
            sessions = max(
                sessions,
                await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND ($1 OR application_name LIKE 'pgworker%')",
                    bouncer is not None,
                ),
            )
            await asyncio.sleep(0.1)
        elapsed = time.monotonic() - t0
        _, pg1, _, busy1, _ = meter.sample()
        cpu1 = [cpu_of(p.pid) for p in procs]
        bouncer1 = cpu_of(bouncer.pid) if bouncer and bouncer.pid else 0.0
        wal1 = await wal_bytes(conn)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    span = await conn.fetchval(
        "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM pgworker.job_attempts"
    )
    per_1k = 1e6 / jobs
    return {
        "handler": handler,
        "mode": "pooled" if bouncer else "direct",
        "workers": workers,
        "jobs": jobs,
        "jobs/s": round(jobs / float(span)),
        "worker CPU ms/1k": round((sum(cpu1) - sum(cpu0)) * per_1k),
        "PostgreSQL CPU ms/1k": round((pg1 - pg0) * per_1k),
        "PgBouncer CPU ms/1k": round((bouncer1 - bouncer0) * per_1k) if bouncer else None,
        "busy cores": round((busy1 - busy0) / elapsed, 2),
        "WAL bytes/job": round((wal1 - wal0) / jobs),
        "server sessions": sessions,
    }


def table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        lines.append(
            "| "
            + " | ".join(
                "" if r[k] is None else f"{r[k]:,}" if isinstance(r[k], int) else str(r[k])
                for k in keys
            )
            + " |"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> None:
    server = await asyncpg.connect(args.dsn)
    await server.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    await server.execute(f"CREATE DATABASE {DATABASE}")
    dsn = args.dsn.rsplit("/", 1)[0] + "/" + DATABASE
    logs = Path(tempfile.mkdtemp(prefix="pgw-bench-fleet-"))
    rows: list[dict[str, Any]] = []
    try:
        conn = await asyncpg.connect(dsn)
        try:
            await pgworker.migrate(conn)
            meter = CpuMeter(postmaster=postmaster_of(conn), exclude={conn.get_server_pid()})
            with PgBouncer(args.dsn, pool_size=args.pool_size) as bouncer:
                for _ in range(args.runs):
                    for handler in args.handlers:
                        for mode in args.modes:
                            for n in args.workers:
                                row = await point(
                                    conn,
                                    dsn,
                                    handler,
                                    n,
                                    bouncer if mode == "pooled" else None,
                                    meter,
                                    logs,
                                    args.noop_jobs,
                                )
                                print(row, flush=True)
                                rows.append(row)
        finally:
            await conn.close()
    finally:
        await server.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        await server.close()
    print(table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dsn",
        default=os.environ.get(
            "PGWORKER_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument(
        "--workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16]
    )
    parser.add_argument("--modes", type=lambda s: s.split(","), default=["direct", "pooled"])
    parser.add_argument("--handlers", type=lambda s: s.split(","), default=["noop", "wait"])
    parser.add_argument("--pool-size", type=int, default=10, help="PgBouncer's default_pool_size")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--noop-jobs",
        type=int,
        default=NOOP_JOBS,
        help="jobs of a no-op drain, whatever the workers",
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
