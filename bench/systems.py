"""One adapter per measured system: schema, bulk enqueue, one-at-a-time enqueue, the worker
command, and the SQL that says when a drain is over and when its first job started and its last
completion was persisted.

Everything here uses the library's own public API as installed in bench/.venv (read from its
source: these APIs change between versions)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import asyncpg

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CONCURRENCY = 10


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


@dataclass
class Interval:
    """Epoch seconds of the first job's start and of the last completion persisted; `how`
    says where each came from."""

    start: float | None
    end: float | None
    how: str


class System:
    name: str = ""
    dist: str = ""
    #: Whether the end of the processing interval comes from a database timestamp (True) or
    #: from the 20 ms poll that saw the last job done (False).
    end_from_db: bool = True
    supports_latency: bool = True
    #: Where the worker's code comes from: its subprocesses run with this directory as cwd and
    #: PYTHONPATH (bench.py's launch). None: this repository.
    src: Path | None = None

    def version(self) -> str:
        return _version(self.dist)

    async def setup(self, dsn: str) -> None:
        raise NotImplementedError

    async def enqueue_bulk(self, dsn: str, n: int, chunk: int) -> float:
        """Enqueue n no-op jobs; returns the seconds the enqueue calls took (connection set-up
        excluded)."""
        raise NotImplementedError

    def worker_argv(self, dsn: str) -> list[str]:
        raise NotImplementedError

    def latency_argv(self, dsn: str) -> list[str]:
        """The worker W2 starts: the same as W1's unless a system says otherwise."""
        return self.worker_argv(dsn)

    #: One row, one boolean column: are jobs still pending or running?
    unfinished_sql: str = ""
    #: One row: epoch of the first start and of the last completion, both at or after $1.
    interval_sql: str = ""
    #: How many jobs ended successfully (a sanity check of each drain).
    done_sql: str = ""

    async def interval(self, conn: asyncpg.Connection, since: float) -> Interval:
        row = await conn.fetchrow(self.interval_sql, since)
        return Interval(row[0], row[1], "database timestamps")

    # One-at-a-time enqueue (W2), used by bench/paced.py and by bench.py's warm-up; the handle
    # is a plain asyncpg connection unless a library needs its own.
    async def open_single(self, dsn: str) -> Any:
        return await asyncpg.connect(dsn)

    async def enqueue_one(self, handle: Any, t: float) -> None:
        raise NotImplementedError

    async def close_single(self, handle: Any) -> None:
        await handle.close()


# --- pgworker -------------------------------------------------------------------------------


# The bulk enqueue of a pgworker checkout given by `src` (--src, --base-src), run by that
# checkout's code in a process of its own; prints the seconds the enqueue calls took.
_ENQUEUE_IN_SRC = """
import asyncio, sys, time
import asyncpg, pgworker

async def main(dsn, n, chunk):
    conn = await asyncpg.connect(dsn)
    try:
        t0 = time.perf_counter()
        for i in range(0, n, chunk):
            specs = [pgworker.JobSpec("noop", {}) for _ in range(min(chunk, n - i))]
            await pgworker.enqueue_many(conn, specs)
        print(time.perf_counter() - t0)
    finally:
        await conn.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def src_env(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src)}


def imported_from(src: Path) -> str:
    """The file of the `pgworker` package that a subprocess run from `src` imports."""
    return subprocess.run(
        [sys.executable, "-c", "import pgworker; print(pgworker.__file__)"],
        cwd=src,
        env=src_env(src),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()


class PgWorker(System):
    name = "pgworker"
    dist = "pgworker"
    unfinished_sql = """
        SELECT EXISTS (SELECT FROM pgworker.jobs WHERE status = 'pending')
            OR EXISTS (SELECT FROM pgworker.jobs WHERE status = 'running')
    """
    interval_sql = """
        SELECT extract(epoch FROM min(started_at))::float8,
               extract(epoch FROM max(finished_at))::float8
        FROM pgworker.job_attempts WHERE started_at >= to_timestamp($1)
    """
    done_sql = "SELECT count(*) FROM pgworker.jobs WHERE status = 'completed'"

    def _cli(self) -> list[str]:
        # From a checkout of its own: `python -m pgworker` run there imports that checkout's.
        return [sys.executable, "-m", "pgworker"] if self.src else [str(BIN / "pgworker")]

    @property
    def supports_latency(self) -> bool:  # type: ignore[override]
        # W2 enqueues from the benchmark's process, with this repository's pgworker.
        return self.src is None

    async def setup(self, dsn: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            *self._cli(),
            "migrate",
            "--dsn",
            dsn,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=self.src,
            env=src_env(self.src) if self.src else None,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        if proc.returncode != 0:
            raise RuntimeError(f"pgworker migrate failed: {out.decode()}")

    async def enqueue_bulk(self, dsn: str, n: int, chunk: int) -> float:
        if self.src:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _ENQUEUE_IN_SRC,
                dsn,
                str(n),
                str(chunk),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                cwd=self.src,
                env=src_env(self.src),
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 600)
            if proc.returncode != 0:
                raise RuntimeError(f"{self.name}: enqueue failed: {out.decode()}")
            return float(out.decode().split()[-1])
        import pgworker

        conn = await asyncpg.connect(dsn)
        try:
            t0 = time.perf_counter()
            for i in range(0, n, chunk):
                specs = [pgworker.JobSpec("noop", {}) for _ in range(min(chunk, n - i))]
                await pgworker.enqueue_many(conn, specs)
            return time.perf_counter() - t0
        finally:
            await conn.close()

    extra_args: tuple[str, ...] = ()

    def worker_argv(self, dsn: str) -> list[str]:
        return [
            *self._cli(),
            "run",
            "bench.apps.pgworker_app",
            "--concurrency",
            str(CONCURRENCY),
            "--log-level",
            "warning",
            "--dsn",
            dsn,
            *self.extra_args,
        ]

    async def enqueue_one(self, handle: Any, t: float) -> None:
        import pgworker

        await pgworker.enqueue(handle, "latency", {"t": t})


class PgWorkerDurable(PgWorker):
    """pgworker with `--durable-claims`: every claim waits for its WAL flush, as the peers' do."""

    name = "pgworker-durable"
    extra_args = ("--durable-claims",)


class PgWorkerBase(PgWorker):
    """pgworker from another checkout (--base-src: a git worktree of an older commit), beside
    this one in the same run: its own migrations, enqueue, worker and bench app."""

    name = "pgworker-base"


# --- procrastinate --------------------------------------------------------------------------


class Procrastinate(System):
    name = "procrastinate"
    dist = "procrastinate"
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


# --- pgqueuer -------------------------------------------------------------------------------


class PgQueuer(System):
    name = "pgqueuer"
    dist = "pgqueuer"
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
    args = ("--batch-size", "10", "--max-concurrent-tasks", "0")
    supports_latency = False


# --- chancy ---------------------------------------------------------------------------------


class ChancySystem(System):
    name = "chancy"
    dist = "chancy"
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


# --- the floor: raw asyncpg, no library -----------------------------------------------------


class Floor(System):
    name = "floor"
    dist = "asyncpg"
    unfinished_sql = """
        SELECT EXISTS (SELECT FROM floor_jobs WHERE status = 'pending')
            OR EXISTS (SELECT FROM floor_jobs WHERE status = 'running')
    """
    interval_sql = """
        SELECT extract(epoch FROM min(started_at))::float8,
               extract(epoch FROM max(finished_at))::float8
        FROM floor_jobs WHERE started_at >= to_timestamp($1)
    """
    done_sql = "SELECT count(*) FROM floor_jobs WHERE status = 'done'"

    async def setup(self, dsn: str) -> None:
        from bench import floor

        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(floor.SCHEMA)
        finally:
            await conn.close()

    async def enqueue_bulk(self, dsn: str, n: int, chunk: int) -> float:
        conn = await asyncpg.connect(dsn)
        try:
            t0 = time.perf_counter()
            await conn.copy_records_to_table(
                "floor_jobs", records=[("{}",)] * n, columns=["payload"]
            )
            return time.perf_counter() - t0
        finally:
            await conn.close()

    async def enqueue_one(self, handle: Any, t: float) -> None:
        from bench import floor

        await handle.execute(floor.ENQUEUE_ONE, json.dumps({"t": t}))

    def worker_argv(self, dsn: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bench.floor",
            "--dsn",
            dsn,
            "--slots",
            str(CONCURRENCY),
            "--batch",
            "10",
        ]

    def latency_argv(self, dsn: str) -> list[str]:
        # pgworker's claims do not wait for their flush by default: neither does the W2 floor.
        return [*self.worker_argv(dsn), "--fast-claims"]


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        PgWorker(),
        PgWorkerDurable(),
        PgWorkerBase(),
        Procrastinate(),
        PgQueuer(),
        PgQueuerDefaults(),
        ChancySystem(),
        Floor(),
    )
}
PEERS = ("procrastinate", "pgqueuer", "chancy")
