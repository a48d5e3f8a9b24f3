"""pgworker's peers: procrastinate, pgqueuer and chancy, each through its own public API as
installed in bench/.venv (read from its source: these APIs change between versions)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import asyncpg

from bench.measure import BIN
from bench.systems.base import CONCURRENCY, Interval, System


class Procrastinate(System):
    name = "procrastinate"
    unfinished_sql = """
        SELECT EXISTS (SELECT FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))
    """
    # Its trigger writes an event row per transition, stamped by the database: `started` when
    # a worker fetches the job, `succeeded` when the worker's finish_job commits.
    interval_sql = """
        SELECT extract(epoch FROM min(at) FILTER (WHERE type = 'started'))::float8,
               extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded'))::float8
        FROM procrastinate_events WHERE at >= to_timestamp($1)
    """
    done_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"

    def _app(self, dsn: str) -> Any:
        from bench.apps import procrastinate_app

        # A fresh App per database (the module's own `app` reads $BENCH_DSN once, at import).
        return procrastinate_app.make_app(dsn)

    async def setup(self, dsn: str) -> None:
        app = self._app(dsn)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def enqueue_bulk(self, dsn: str, n: int, chunk: int) -> float:
        app = self._app(dsn)
        async with app.open_async():
            task = app.tasks["noop"]
            t0 = time.perf_counter()
            for i in range(0, n, chunk):
                await task.batch_defer_async(*[{} for _ in range(min(chunk, n - i))])
            return time.perf_counter() - t0

    def worker_argv(self, dsn: str) -> list[str]:
        return [
            str(BIN / "procrastinate"),
            "--app",
            "bench.apps.procrastinate_app.app",
            "--log-level",
            "warning",
            "worker",
            "--concurrency",
            str(CONCURRENCY),
        ]

    async def open_single(self, dsn: str) -> Any:
        app = self._app(dsn)
        await app.open_async()
        return app

    async def enqueue_one(self, handle: Any, t: float) -> None:
        await handle.tasks["latency"].defer_async(t=t)

    async def close_single(self, handle: Any) -> None:
        await handle.close_async()


class PgQueuer(System):
    name = "pgqueuer"
    title = "pgqueuer (concurrency 10)"
    note = (
        "pgqueuer (concurrency 10): `pgqueuer.run(..., batch_size=5, max_concurrent_tasks=10)`, "
        "as in the issue's reference figures (pgqueuer requires the cap to be at least twice the "
        "batch)."
    )
    # Finished jobs are deleted from the queue table (and logged) in one statement.
    unfinished_sql = "SELECT EXISTS (SELECT FROM pgqueuer)"
    # pgqueuer_log gets a `picked` row in the dequeue statement and a `successful` row when the
    # worker's status buffer is flushed, both stamped now() by the database.
    interval_sql = """
        SELECT extract(epoch FROM min(created) FILTER (WHERE status = 'picked'))::float8,
               extract(epoch FROM max(created) FILTER (WHERE status = 'successful'))::float8
        FROM pgqueuer_log WHERE created >= to_timestamp($1)
    """
    done_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"

    async def setup(self, dsn: str) -> None:
        from pgqueuer import Queries

        conn = await asyncpg.connect(dsn)
        try:
            await Queries.from_asyncpg_connection(conn).install()
        finally:
            await conn.close()

    async def enqueue_bulk(self, dsn: str, n: int, chunk: int) -> float:
        from pgqueuer import Queries

        conn = await asyncpg.connect(dsn)
        try:
            q = Queries.from_asyncpg_connection(conn)
            t0 = time.perf_counter()
            for i in range(0, n, chunk):
                k = min(chunk, n - i)
                await q.enqueue(["noop"] * k, [None] * k, [0] * k)
            return time.perf_counter() - t0
        finally:
            await conn.close()

    #: pgqueuer at the others' concurrency, as in the reference figures: at most 10 jobs picked
    #: and not finished per worker, enforced by its dequeue query; it requires the cap to be at
    #: least twice the batch, so at most 5 are claimed per dequeue.
    args: tuple[str, ...] = ("--batch-size", "5", "--max-concurrent-tasks", str(CONCURRENCY))

    def worker_argv(self, dsn: str) -> list[str]:
        # See bench/apps/pgqueuer_app.py for why not the `pgq run` CLI.
        return [sys.executable, "-m", "bench.apps.pgqueuer_app", *self.args]

    async def open_single(self, dsn: str) -> Any:
        from pgqueuer import Queries

        conn = await asyncpg.connect(dsn)
        return conn, Queries.from_asyncpg_connection(conn)

    async def enqueue_one(self, handle: Any, t: float) -> None:
        await handle[1].enqueue("latency", f"{t:.6f}".encode())

    async def close_single(self, handle: Any) -> None:
        await handle[0].close()


class PgQueuerDefaults(PgQueuer):
    """pgqueuer with its own defaults: 10 per dequeue and no cap on the jobs in flight, so not
    at concurrency 10. Shown beside the others, outside the same-concurrency ratios."""

    name = "pgqueuer-defaults"
    title = "pgqueuer, own defaults (no concurrency cap)"
    note = (
        "pgqueuer, own defaults: `batch_size=10`, no cap on jobs in flight; not a peer in the "
        "ratios at the same concurrency."
    )
    args = ("--batch-size", "10", "--max-concurrent-tasks", "0")
    supports_latency = False


class ChancySystem(System):
    name = "chancy"
    note = "chancy: asyncio executor, queue concurrency 10, eager_polling=True."
    # chancy's workers write `completed_at` from their own clock and flush job updates in
    # batches once a second; the completion counts when the poll sees it persisted.
    end_from_db = False
    unfinished_sql = """
        SELECT EXISTS (SELECT FROM chancy_jobs
                       WHERE state IN ('pending', 'running', 'retrying'))
    """
    interval_sql = """
        SELECT extract(epoch FROM min(started_at))::float8, NULL::float8
        FROM chancy_jobs WHERE started_at >= to_timestamp($1)
    """
    done_sql = "SELECT count(*) FROM chancy_jobs WHERE state = 'succeeded'"

    async def interval(self, conn: asyncpg.Connection, since: float) -> Interval:
        row = await conn.fetchrow(self.interval_sql, since)
        return Interval(row[0], None, "start: database timestamp; end: 20 ms poll")

    def _app(self, dsn: str) -> Any:
        os.environ["BENCH_DSN"] = dsn
        from bench.apps import chancy_app

        return chancy_app.make_app()

    async def setup(self, dsn: str) -> None:
        from bench.apps import chancy_app

        async with self._app(dsn) as chancy:
            await chancy.migrate()
            await chancy.declare(chancy_app.queue(), upsert=True)

    async def enqueue_bulk(self, dsn: str, n: int, chunk: int) -> float:
        from chancy import Job

        from bench.apps import chancy_app

        async with self._app(dsn) as chancy:
            t0 = time.perf_counter()
            jobs = [
                Job(func="bench.apps.chancy_app.noop", queue=chancy_app.QUEUE) for _ in range(n)
            ]
            async for _ in chancy.push_many(jobs, batch_size=chunk):
                pass
            return time.perf_counter() - t0

    def worker_argv(self, dsn: str) -> list[str]:
        return [
            str(BIN / "chancy"),
            "--app",
            "bench.apps.chancy_app.make_app",
            "worker",
            "start",
        ]

    async def open_single(self, dsn: str) -> Any:
        chancy = self._app(dsn)
        await chancy.__aenter__()
        return chancy

    async def enqueue_one(self, handle: Any, t: float) -> None:
        from chancy import Job

        from bench.apps import chancy_app

        await handle.push(
            Job(func="bench.apps.chancy_app.latency", queue=chancy_app.QUEUE, kwargs={"t": t})
        )

    async def close_single(self, handle: Any) -> None:
        await handle.__aexit__(None, None, None)
