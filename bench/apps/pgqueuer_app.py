"""pgqueuer handlers, and the worker: `python -m bench.apps.pgqueuer_app`.

That is what `pgq run bench.apps.pgqueuer_app:create --batch-size 10 --log-level WARNING` does
(the same `pgqueuer.run` supervisor, on uvloop like the CLI), but pgqueuer 1.6.0's `pgq run`
crashes before starting with the current typer (`setup_fancy_logger` gets the log level as a str:
AttributeError: 'str' object has no attribute 'name'), so the bench calls it from Python.

The factory is an async context manager (pgqueuer 1.x) over one asyncpg connection, as pgqueuer's
own examples use."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.models import Job

from .common import record_latency

BATCH_SIZE = 10


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

    logconfig.setup_fancy_logger(logconfig.LogLevel.WARNING)
    coro = pgqueuer.run(create, batch_size=BATCH_SIZE)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


if __name__ == "__main__":
    main()
