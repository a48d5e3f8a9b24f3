"""The floor: raw asyncpg, no library (the worker is bench/floor.py)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import asyncpg

from bench import floor
from bench.systems.base import CONCURRENCY, System

MOST_SLOTS = 40
"""The floor's loops at most, each on a connection of its own: at concurrency 100, a loop per
job would pass a default server's max_connections (100). Forty loops claiming 10 each already
keep more claims in flight than the two cores can serve."""


class Floor(System):
    name = "floor"
    title = "floor: raw asyncpg, no library (W3; W2 floor, fast claims)"
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
        await handle.execute(floor.ENQUEUE_ONE, json.dumps({"t": t}))

    def worker_argv(self, dsn: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bench.floor",
            "--dsn",
            dsn,
            "--slots",
            str(min(CONCURRENCY, MOST_SLOTS)),
            "--batch",
            "10",
        ]

    def latency_argv(self, dsn: str) -> list[str]:
        # pgworker's claims do not wait for their flush by default: neither does the W2 floor.
        return [*self.worker_argv(dsn), "--fast-claims"]
