"""What the benchmark asks of a measured system; bench/systems/ holds one subclass per system."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "10"))
"""The jobs one worker process runs at once, every system alike (the floor's slots)."""


@dataclass
class Interval:
    """Epoch seconds of the first job's start and of the last completion persisted; `how`
    says where each came from."""

    start: float | None
    end: float | None
    how: str


class System:
    name: str = ""
    #: Whether the end of the processing interval comes from a database timestamp (True) or
    #: from the 20 ms poll that saw the last job done (False).
    end_from_db: bool = True
    supports_latency: bool = True
    #: Where the worker's code comes from: its subprocesses run with this directory as cwd and
    #: PYTHONPATH (bench/measure.py's launch). None: this repository.
    src: Path | None = None
    #: Its row's name in the table, when not `name`.
    title: str = ""
    #: How the system was configured, said under the table (what its row's title cannot say).
    note: str = ""

    def label(self, config: dict[str, Any]) -> str:
        """Its row's name in the table; `config` is the report's."""
        return self.title or self.name

    async def setup(self, dsn: str) -> None:
        raise NotImplementedError

    async def enqueue_bulk(self, dsn: str, n: int, chunk: int) -> float:
        """Enqueue n no-op jobs; returns the seconds the enqueue calls took (connection set-up
        excluded)."""
        raise NotImplementedError

    def worker_argv(self, dsn: str) -> list[str]:
        raise NotImplementedError

    def side_pid(self) -> int | None:
        """A process the system needs beside its worker (a pooler), whose CPU is counted apart."""
        return None

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

    async def check(self, dsn: str, n: int) -> str:
        """The drain's sanity check, the table's last column: did all n jobs succeed?"""
        conn = await asyncpg.connect(dsn)
        try:
            done = await conn.fetchval(self.done_sql)
        finally:
            await conn.close()
        return f"{'ok' if done == n else 'FAIL'}: {done}/{n} succeeded"

    async def drain_figures(self, dsn: str, n: int) -> dict[str, Any]:
        """Figures of a finished drain beyond the common ones, kept in the JSON."""
        return {}

    def extra_report(self, report: dict[str, Any]) -> list[str]:
        """Sections of the report about this system alone, from what its workloads left in
        `report`."""
        return []

    # One-at-a-time enqueue (W2), used by bench/paced.py and by W2's warm-up; the handle is a
    # plain asyncpg connection unless a library needs its own.
    async def open_single(self, dsn: str) -> Any:
        return await asyncpg.connect(dsn)

    async def enqueue_one(self, handle: Any, t: float) -> None:
        raise NotImplementedError

    async def close_single(self, handle: Any) -> None:
        await handle.close()
