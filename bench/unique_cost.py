"""What a unique key costs at enqueue (issue 24, item 1), beside plain enqueue.

    PYTHONPATH=. python -m bench.unique_cost [--dsn DSN] [--n 5000] [--batch 10000] [--runs 3]
        [--plain-only]

In a database of its own (`bench_unique_cost`, dropped at the end), one process, one connection:

- enqueue, plain: `--n` sequential `pgworker.enqueue(conn, "t", {"n": i})`;
- enqueue, unique_key new: the same with a key of its own per job (each one inserted);
- enqueue, unique_key taken: the same with one key, held by a pending job (each one returns it);
- enqueue, replace: the same with one key and replace=True (each one updates the pending job);
- enqueue_many, plain: one batch of `--batch` specs (COPY);
- enqueue_many, unique_key new: one batch of `--batch` specs each with a key of its own (one
  statement per spec, in the batch's transaction).

Each figure is jobs (calls) per second, the median of `--runs` runs, the table emptied before
each. `--transaction` runs each case in one transaction (no commit per call: the statements'
own cost, less noisy on a shared machine). `--plain-only` measures the two plain cases only:
run it from an older checkout (PYTHONPATH=/path/to/old) to compare plain enqueue old against
new.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

import pgworker
from pgworker import JobSpec

DATABASE = "bench_unique_cost"


def _dsn_of(dsn: str, database: str) -> str:
    base, _, _ = dsn.rpartition("/")
    return f"{base}/{database}"


async def _timed(conn: Any, work: Callable[[], Awaitable[int]], in_transaction: bool) -> float:
    await conn.execute("TRUNCATE pgworker.jobs")
    start = time.perf_counter()
    if in_transaction:
        async with conn.transaction():
            done = await work()
    else:
        done = await work()
    return done / (time.perf_counter() - start)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--plain-only", action="store_true")
    parser.add_argument(
        "--transaction",
        action="store_true",
        help="run each case in one transaction: the cost of the statements, without a commit "
        "(and its flush to disk) per call",
    )
    args = parser.parse_args()
    admin = await asyncpg.connect(args.dsn)
    await admin.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
    await admin.execute(f"CREATE DATABASE {DATABASE}")
    try:
        conn = await asyncpg.connect(_dsn_of(args.dsn, DATABASE))
        try:
            await pgworker.migrate(conn)
            n, batch = args.n, args.batch

            async def plain() -> int:
                for i in range(n):
                    await pgworker.enqueue(conn, "t", {"n": i})
                return n

            async def unique_new() -> int:
                for i in range(n):
                    await pgworker.enqueue(conn, "t", {"n": i}, unique_key=f"k-{i}")
                return n

            async def unique_taken() -> int:
                for i in range(n):
                    await pgworker.enqueue(conn, "t", {"n": i}, unique_key="one")
                return n

            async def replace() -> int:
                for i in range(n):
                    await pgworker.enqueue(conn, "t", {"n": i}, unique_key="one", replace=True)
                return n

            async def many_plain() -> int:
                await pgworker.enqueue_many(conn, [JobSpec("t", {"n": i}) for i in range(batch)])
                return batch

            async def many_unique() -> int:
                specs = [JobSpec("t", {"n": i}, unique_key=f"k-{i}") for i in range(batch)]
                await pgworker.enqueue_many(conn, specs)
                return batch

            cases: list[tuple[str, Callable[[], Awaitable[int]]]] = [
                (f"enqueue x{n}, plain", plain),
                (f"enqueue_many of {batch}, plain (COPY)", many_plain),
            ]
            if not args.plain_only:
                cases += [
                    (f"enqueue x{n}, unique_key new", unique_new),
                    (f"enqueue x{n}, unique_key taken", unique_taken),
                    (f"enqueue x{n}, unique_key replace", replace),
                    (f"enqueue_many of {batch}, unique_key new", many_unique),
                ]
            rates: dict[str, list[float]] = {name: [] for name, _ in cases}
            for _ in range(args.runs):
                for name, work in cases:
                    rates[name].append(await _timed(conn, work, args.transaction))
            print(f"pgworker from {pgworker.__file__}")
            print(f"{'case':<44} {'jobs/s (median)':>16} {'runs':>30}")
            for name, found in rates.items():
                runs = ", ".join(f"{r:,.0f}" for r in found)
                print(f"{name:<44} {statistics.median(found):>16,.0f} {runs:>30}")
        finally:
            await conn.close()
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
