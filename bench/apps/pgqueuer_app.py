"""pgqueuer handlers, and the worker: `python -m bench.apps.pgqueuer_app`.

    python -m bench.apps.pgqueuer_app [--batch-size 5] [--max-concurrent-tasks 10]

That is what `pgq run bench.apps.pgqueuer_app:create --batch-size 5 --max-concurrent-tasks 10
--log-level WARNING` does (the same `pgqueuer.run` supervisor, on uvloop like the CLI), but
pgqueuer 1.6.0's `pgq run` crashes before starting with the current typer (`setup_fancy_logger`
gets the log level as a str: AttributeError: 'str' object has no attribute 'name'), so the bench
calls it from Python. A cap of 0 means none (pgqueuer's own default).

The factory is an async context manager (pgqueuer 1.x) over one asyncpg connection, as pgqueuer's
own examples use."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.models import Job

from .common import record_latency


@asynccontextmanager
async def create() -> AsyncIterator[PgQueuer]:
    conn = await asyncpg.connect(os.environ["BENCH_DSN"])
    try:
        pgq = PgQueuer.from_asyncpg_connection(conn)

        @pgq.entrypoint("noop")
        async def noop(job: Job) -> None:
            return None

        @pgq.entrypoint("latency")
        async def latency(job: Job) -> None:
            record_latency(float((job.payload or b"0").decode()))

        yield pgq
    finally:
        await conn.close()


def main() -> None:
    import pgqueuer
    from pgqueuer.core import logconfig

    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=5)
    p.add_argument("--max-concurrent-tasks", type=int, default=10)
    a = p.parse_args()
    logconfig.setup_fancy_logger(logconfig.LogLevel.WARNING)
    coro = pgqueuer.run(
        create, batch_size=a.batch_size, max_concurrent_tasks=a.max_concurrent_tasks or None
    )
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


if __name__ == "__main__":
    main()
