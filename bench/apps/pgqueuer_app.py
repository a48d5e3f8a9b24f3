"""pgqueuer handlers: `pgq run bench.apps.pgqueuer_app:create --batch-size 10`.

The factory is an async context manager (pgqueuer 1.x): one asyncpg connection, as `pgq run`'s
own examples use."""

from __future__ import annotations

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
