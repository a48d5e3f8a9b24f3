"""What the row triggers on a job's status (migration 18, awaiting a job; migration 19,
dependencies) cost the jobs that use neither: the claim and the outcome write of plain jobs, with
the triggers (`new`) and without them (`old`, disabled), in rounds that alternate the two.

    PYTHONPATH=. python -m bench.await_cost [--dsn DSN] [--jobs 20000] [--batch 100] [--rounds 4]

In a database of its own (`bench_await_cost`, dropped at the end), migrated to the latest schema,
each round enqueues `--jobs` no-op jobs, then claims them `--batch` at a time with the worker's
claim statement on a worker's pool (generic plans) and writes their outcomes with the completer's
statement (`job_finish_many`), and reports the microseconds per job of each. The triggers' WHEN
clauses are evaluated for every row whose status the claim or the outcome write changes: this is
where a cost would show."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg

import pgworker
from pgworker._db.connection import create_pool
from pgworker._db.queries import queries
from pgworker.models import AttemptResult, JobStatus, Outcome

DATABASE = "bench_await_cost"
TRIGGERS = (
    "jobs_ended_notify",  # migration 18
    "jobs_release_dependants",  # migration 19
    "jobs_repark_dependants",
    "jobs_recount_parents",
)
"""The row triggers on a job's status, each with a WHEN clause that plain jobs fail."""


async def one_round(pool: asyncpg.Pool, jobs: int, batch: int) -> tuple[float, float]:
    q = queries("pgworker")
    async with pool.acquire() as conn:
        await conn.execute("TRUNCATE pgworker.jobs, pgworker.job_attempts")
        await pgworker.enqueue_many(conn, [pgworker.JobSpec("noop") for _ in range(jobs)])
        await conn.execute("VACUUM ANALYZE pgworker.jobs")
        claiming = finishing = 0.0
        while True:
            started = time.perf_counter()
            rows = await q.job_claim(
                conn,
                queues=["default"],
                types=["noop"],
                default_max_retries=[3],
                limit=batch,
                worker_id="bench",
                lease=60,
                code_version=None,
            )
            claiming += time.perf_counter() - started
            if not rows:
                break
            results = [
                AttemptResult(
                    r["id"],
                    r["attempts"],
                    r["claimed_at"],
                    JobStatus.COMPLETED,
                    Outcome.COMPLETED,
                    "null",
                )
                for r in rows
            ]
            started = time.perf_counter()
            written = await q.job_finish_many(conn, results)
            finishing += time.perf_counter() - started
            assert len(written) == len(rows)
    return claiming / jobs * 1e6, finishing / jobs * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    server = await asyncpg.connect(args.dsn)
    await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
    await server.execute(f"CREATE DATABASE {DATABASE}")
    dsn = args.dsn.rsplit("/", 1)[0] + "/" + DATABASE
    try:
        admin = await asyncpg.connect(dsn)
        await pgworker.migrate(admin)
        pool = await create_pool(dsn, 2, keyed=True)
        found: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        for _ in range(args.rounds):
            for label in ("old", "new"):
                action = "ENABLE" if label == "new" else "DISABLE"
                for trigger in TRIGGERS:
                    await admin.execute(f"ALTER TABLE pgworker.jobs {action} TRIGGER {trigger}")
                await pool.expire_connections()
                found[label].append(await one_round(pool, args.jobs, args.batch))
        for label, rounds in found.items():
            claim = statistics.median(c for c, _ in rounds)
            finish = statistics.median(f for _, f in rounds)
            print(
                f"{label}: claim {claim:.1f} us/job, finish {finish:.1f} us/job "
                f"(median of {len(rounds)} rounds of {args.jobs} jobs)"
            )
        await pool.close()
        await admin.close()
    finally:
        await server.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        await server.close()


if __name__ == "__main__":
    asyncio.run(main())
